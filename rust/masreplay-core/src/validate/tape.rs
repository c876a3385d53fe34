//! JSON documents held as a flat tape: the nodes in document order, each container followed by
//! its contents, and every string in one shared text buffer. A tape is cheap to build (two
//! growing buffers, no allocation per value), owns its data, and is read by the same serde
//! visitors as JSON text, so a caller can fill it where it must (the Python bindings copy
//! Python objects into it while they hold the GIL) and check it elsewhere, in parallel.
//!
//! A tape holds only what JSON can: the builder's caller rejects non-finite numbers and
//! non-string keys before they get here.

use std::fmt;

use serde_core::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_core::forward_to_deserialize_any;

#[derive(Clone, Copy, Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str {
        start: usize,
        end: usize,
    },
    /// `len` items (objects: key, value pairs) follow; `end` is the index after the last.
    Array {
        len: usize,
        end: usize,
    },
    Object {
        len: usize,
        end: usize,
    },
}

/// Documents written one after another; a document is named by the index of its first node.
#[derive(Default)]
pub struct Tape {
    nodes: Vec<Node>,
    text: String,
}

/// An open container, to be closed with its length once its contents are written.
#[must_use]
pub struct Open(usize);

impl Tape {
    pub fn new() -> Self {
        Self::default()
    }

    /// The index the next node gets: a document's root when called before writing it.
    pub fn mark(&self) -> usize {
        self.nodes.len()
    }

    /// Empties the tape, keeping its buffers for the next documents.
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.text.clear();
    }

    /// Forgets everything written since `mark` (a document whose snapshot failed half-way).
    /// Its text stays in the buffer, unreferenced.
    pub fn truncate(&mut self, mark: usize) {
        self.nodes.truncate(mark);
    }

    pub fn null(&mut self) {
        self.nodes.push(Node::Null);
    }

    pub fn bool(&mut self, value: bool) {
        self.nodes.push(Node::Bool(value));
    }

    pub fn int(&mut self, value: i64) {
        self.nodes.push(Node::Int(value));
    }

    pub fn uint(&mut self, value: u64) {
        self.nodes.push(Node::UInt(value));
    }

    /// A finite number (JSON has no other).
    pub fn float(&mut self, value: f64) {
        debug_assert!(value.is_finite());
        self.nodes.push(Node::Float(value));
    }

    /// A string value, or an object's key (written before its value).
    pub fn str(&mut self, value: &str) {
        let start = self.text.len();
        self.text.push_str(value);
        self.nodes.push(Node::Str { start, end: self.text.len() });
    }

    pub fn open_array(&mut self) -> Open {
        self.nodes.push(Node::Array { len: 0, end: 0 });
        Open(self.nodes.len() - 1)
    }

    pub fn open_object(&mut self) -> Open {
        self.nodes.push(Node::Object { len: 0, end: 0 });
        Open(self.nodes.len() - 1)
    }

    /// Closes a container that holds `len` items (an object: `len` key, value pairs).
    pub fn close(&mut self, open: Open, len: usize) {
        let end = self.nodes.len();
        match &mut self.nodes[open.0] {
            Node::Array { len: l, end: e } | Node::Object { len: l, end: e } => (*l, *e) = (len, end),
            _ => unreachable!("Open is only made for containers"),
        }
    }

    /// The document at `root` as a serde deserializer.
    pub fn document(&self, root: usize) -> At<'_> {
        At { tape: self, at: root }
    }

    /// The index after the value at `at`.
    fn after(&self, at: usize) -> usize {
        match self.nodes[at] {
            Node::Array { end, .. } | Node::Object { end, .. } => end,
            _ => at + 1,
        }
    }

    fn text_of(&self, start: usize, end: usize) -> &str {
        &self.text[start..end]
    }
}

/// The error of reading a tape with visitors that expect another shape.
#[derive(Debug)]
pub struct TapeError(String);

impl fmt::Display for TapeError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TapeError {}

impl de::Error for TapeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        TapeError(message.to_string())
    }
}

/// One value of a tape, read as serde reads JSON text: non-negative integers as u64, strings
/// borrowed from the tape.
#[derive(Clone, Copy)]
pub struct At<'a> {
    tape: &'a Tape,
    at: usize,
}

impl<'de> Deserializer<'de> for At<'de> {
    type Error = TapeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TapeError> {
        let tape = self.tape;
        match tape.nodes[self.at] {
            Node::Null => visitor.visit_unit(),
            Node::Bool(value) => visitor.visit_bool(value),
            Node::Int(value) if value >= 0 => visitor.visit_u64(value as u64),
            Node::Int(value) => visitor.visit_i64(value),
            Node::UInt(value) => visitor.visit_u64(value),
            Node::Float(value) => visitor.visit_f64(value),
            Node::Str { start, end } => visitor.visit_borrowed_str(tape.text_of(start, end)),
            Node::Array { len, .. } => visitor.visit_seq(Items { tape, at: self.at + 1, left: len }),
            Node::Object { len, .. } => visitor.visit_map(Items { tape, at: self.at + 1, left: len }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TapeError> {
        match self.tape.nodes[self.at] {
            Node::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// The items of an array, or the key, value pairs of an object, from `at` on.
struct Items<'a> {
    tape: &'a Tape,
    at: usize,
    left: usize,
}

impl<'de> SeqAccess<'de> for Items<'de> {
    type Error = TapeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, TapeError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let item = At { tape: self.tape, at: self.at };
        self.at = self.tape.after(self.at);
        seed.deserialize(item).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> MapAccess<'de> for Items<'de> {
    type Error = TapeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, TapeError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let key = At { tape: self.tape, at: self.at };
        self.at += 1; // a key is one string node
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, TapeError> {
        let value = At { tape: self.tape, at: self.at };
        self.at = self.tape.after(self.at);
        seed.deserialize(value)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}
