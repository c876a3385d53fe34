//! The fast read of a common line: one pass over the text, 64 bytes at a time, finds the
//! quotes that open and close its strings and checks every escape; the reader then steps over
//! the values a [`Keep`] leaves out string by string, not byte by byte. (MARBLE logs are 90%
//! such text, an escape every 36 bytes; serde_json's skipping of it was a third of a
//! conversion.)
//!
//! It reads only what it is sure of: a line with a control character (JSON whitespace other
//! than spaces included), a NaN or Infinity literal, nesting past [`MAX_NESTING`], or anything
//! it does not take gets `None`, and serde_json reads that line and words its error. Where it
//! returns a value, it is the value serde_json's guided read returns: the strings that hold
//! escapes, and the numbers, are decoded by serde_json itself.

use std::borrow::Cow;

use serde_core::de::DeserializeSeed;

use super::{Entries, Guided, Json, Keep, MAX_NESTING};

/// The value of `text` (one JSON value, spaces around it allowed), read as `keep` says;
/// `None` when this reader leaves the text to serde_json.
pub(crate) fn read<'a>(text: &'a str, keep: &Keep) -> Option<Json<'a>> {
    if !cfg!(target_arch = "x86_64") {
        // Elsewhere the blocks would be scanned a byte at a time: slower than serde_json.
        return None;
    }
    let mut reader = Reader { text, quotes: string_quotes(text.as_bytes())?, at: 0 };
    reader.space();
    let value = reader.value(keep, 0)?;
    reader.space();
    (reader.at == text.len()).then_some(value)
}

/// A position in a line whose string quotes are known.
struct Reader<'a> {
    text: &'a str,
    /// One bit per byte of the text: the quotes that open or close a string.
    quotes: Vec<u64>,
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Past the spaces at the current position (the only whitespace a line read here holds).
    fn space(&mut self) {
        while self.peek() == Some(b' ') {
            self.at += 1;
        }
    }

    /// Past `byte`, when it is the current one.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    /// The value at the current position, at nesting `depth`, keeping what `keep` says.
    fn value(&mut self, keep: &Keep, depth: usize) -> Option<Json<'a>> {
        match self.peek()? {
            b'{' => {
                let depth = enter(depth)?;
                let mut entries = Entries::new(keep);
                self.members(b'}', |reader| {
                    let key = reader.key()?;
                    match entries.slot(&key) {
                        Some((keep, bit)) => {
                            let value = reader.value(keep, depth)?;
                            entries.put(key, value, bit);
                        }
                        None => {
                            reader.skip(depth)?;
                            entries.skipped(key);
                        }
                    }
                    Some(())
                })?;
                Some(Json::Object(entries.into_entries()))
            }
            b'[' => {
                let depth = enter(depth)?;
                let item = match keep {
                    Keep::Items(item) => item,
                    keep => keep,
                };
                let mut items = Vec::new();
                self.members(b']', |reader| {
                    items.push(reader.value(item, depth)?);
                    Some(())
                })?;
                Some(Json::Array(items))
            }
            b'"' => self.string().map(Json::Str),
            _ => {
                let start = self.at;
                self.skip_scalar()?;
                let token = self.text.get(start..self.at)?;
                match token {
                    "null" => Some(Json::Null),
                    "true" => Some(Json::Bool(true)),
                    "false" => Some(Json::Bool(false)),
                    number => self::number(number),
                }
            }
        }
    }

    /// Steps over the value at the current position, at nesting `depth`, checking it is JSON.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string_end().map(drop),
            b'{' => {
                let depth = enter(depth)?;
                self.members(b'}', |reader| {
                    reader.key_end()?;
                    reader.skip(depth)
                })
            }
            b'[' => {
                let depth = enter(depth)?;
                self.members(b']', |reader| reader.skip(depth))
            }
            _ => self.skip_scalar(),
        }
    }

    /// The members of the array or object whose bracket is at the current position, each read
    /// by `member` (an object's key included), separated by commas up to the `close` bracket.
    fn members(&mut self, close: u8, mut member: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.at += 1;
        self.space();
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            member(self)?;
            self.space();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.space();
                }
                byte if byte == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An object key and the colon after it.
    fn key(&mut self) -> Option<Cow<'a, str>> {
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.string()?;
        self.colon()?;
        Some(key)
    }

    /// Steps over an object key and the colon after it.
    fn key_end(&mut self) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        self.string_end()?;
        self.colon()
    }

    fn colon(&mut self) -> Option<()> {
        self.space();
        self.eat(b':')?;
        self.space();
        Some(())
    }

    /// The string whose opening quote is at the current position: borrowed when it has no
    /// escapes, else as serde_json decodes it (a lone surrogate is its error, and so ours).
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let start = self.at;
        let end = self.string_end()?;
        let inside = self.text.get(start + 1..end)?;
        if memchr::memchr(b'\\', inside.as_bytes()).is_none() {
            return Some(Cow::Borrowed(inside));
        }
        serde_json::from_str::<String>(self.text.get(start..=end)?).ok().map(Cow::Owned)
    }

    /// Moves past the string whose opening quote is at the current position; returns the
    /// position of its closing quote.
    fn string_end(&mut self) -> Option<usize> {
        let from = self.at + 1;
        let mut word = from / 64;
        let mut bits = self.quotes.get(word)? & (u64::MAX << (from % 64));
        while bits == 0 {
            word += 1;
            bits = *self.quotes.get(word)?;
        }
        let end = word * 64 + bits.trailing_zeros() as usize;
        self.at = end + 1;
        Some(end)
    }

    /// Moves past the literal or number at the current position (JSON's grammar: no NaN,
    /// no leading zeros, digits on both sides of a point).
    fn skip_scalar(&mut self) -> Option<()> {
        let rest = self.text.as_bytes().get(self.at..)?;
        if let Some(literal) = [&b"true"[..], b"false", b"null"].into_iter().find(|literal| rest.starts_with(literal)) {
            self.at += literal.len();
            return Some(());
        }
        self.at += number_length(rest)?;
        Some(())
    }
}

/// The length of the number that `bytes` start with, by JSON's grammar (no NaN, no leading
/// zeros, digits on both sides of a point); `None` when they start with none.
pub(crate) fn number_length(bytes: &[u8]) -> Option<usize> {
    let digits = |from: usize| from + bytes[from..].iter().take_while(|byte| byte.is_ascii_digit()).count();
    let mut at = usize::from(bytes.first() == Some(&b'-'));
    at = match bytes.get(at)? {
        b'0' => at + 1,
        b'1'..=b'9' => digits(at + 1),
        _ => return None,
    };
    if bytes.get(at) == Some(&b'.') {
        let end = digits(at + 1);
        if end == at + 1 {
            return None;
        }
        at = end;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let end = digits(at);
        if end == at {
            return None;
        }
        at = end;
    }
    Some(at)
}

/// A number token (its grammar checked) as serde_json reads it, to the last bit of a float
/// and the int/float line; `None` where serde_json refuses it (a float out of range).
pub(crate) fn number(token: &str) -> Option<Json<'_>> {
    if let Some(integer) = small_integer(token) {
        return Some(Json::Int(integer));
    }
    let mut deserializer = serde_json::Deserializer::from_str(token);
    Guided(&Keep::All, 0).deserialize(&mut deserializer).ok()
}

/// The value of a number token (JSON's grammar checked) written as an integer of at most 18
/// digits, as serde_json reads it; `None` for the others (and for `-0`, a float to serde_json).
fn small_integer(token: &str) -> Option<i64> {
    let digits = token.strip_prefix('-').unwrap_or(token);
    if digits.len() > 18 || token == "-0" || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    token.parse().ok()
}

/// The nesting of a container's members; past [`MAX_NESTING`], read or skipped, the line is
/// left to serde_json (Python would not read it).
fn enter(depth: usize) -> Option<usize> {
    (depth < MAX_NESTING).then_some(depth + 1)
}

/// One bit per byte of `bytes`, set at each quote that opens or closes a string (one not
/// escaped by an odd run of backslashes); `None` when the text holds a control character or
/// an escape JSON does not have.
fn string_quotes(bytes: &[u8]) -> Option<Vec<u64>> {
    let mut quotes = Vec::with_capacity(bytes.len().div_ceil(64));
    let (mut carry, mut control) = (false, false);
    let mut padded = [b' '; 64];
    for (number, chunk) in bytes.chunks(64).enumerate() {
        let block: &[u8; 64] = match chunk.try_into() {
            Ok(block) => block,
            Err(_) => {
                padded[..chunk.len()].copy_from_slice(chunk);
                &padded
            }
        };
        let masks = masks(block);
        control |= masks.control;
        let escaped = escaped(masks.backslash, &mut carry);
        quotes.push(masks.quote & !escaped);
        // An escaped quote or backslash is valid as it is; check the others one by one.
        let mut escapes = escaped & !masks.quote & !masks.backslash;
        while escapes != 0 {
            let at = number * 64 + escapes.trailing_zeros() as usize;
            escapes &= escapes - 1;
            if !valid_escape(bytes, at) {
                return None;
            }
        }
    }
    (!control).then_some(quotes)
}

/// Whether the byte at `at`, after a backslash, makes one of JSON's escapes.
fn valid_escape(bytes: &[u8], at: usize) -> bool {
    match bytes.get(at) {
        Some(b'/' | b'b' | b'f' | b'n' | b'r' | b't') => true,
        Some(b'u') => bytes.get(at + 1..at + 5).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)),
        _ => false,
    }
}

const EVEN: u64 = 0x5555_5555_5555_5555;
const ODD: u64 = !EVEN;

/// The bytes of a block that a backslash escapes, from the block's backslashes; `carry` says
/// whether the previous block's last backslash escapes this block's first byte, and is set
/// for the next block. In a run of backslashes each odd one escapes the byte after it: bits
/// 1, 3, ... of the run, and the byte after the run when its length is odd.
fn escaped(backslash: u64, carry: &mut bool) -> u64 {
    let first = u64::from(*carry);
    // A backslash escaped by the previous block escapes nothing.
    let backslash = backslash & !first;
    let starts = backslash & !(backslash << 1);
    // Adding a run's first bit to it clears the run (the carry stops at the byte after it,
    // which is no backslash): what stays are the runs that start at odd positions.
    let odd_runs = backslash & backslash.wrapping_add(starts & EVEN);
    let even_runs = backslash & !odd_runs;
    // A run that starts at an even position escapes odd positions, and the other way round.
    *carry = odd_runs >> 63 == 1;
    ((even_runs << 1) & ODD) | ((odd_runs << 1) & EVEN) | first
}

/// Where a block holds backslashes and quotes (a bit per byte), and whether it holds a
/// control character.
#[derive(Debug, Default, PartialEq)]
struct Masks {
    backslash: u64,
    quote: u64,
    control: bool,
}

/// The block's masks, 16 bytes at a time with SSE2 (which every x86_64 processor has).
#[cfg(target_arch = "x86_64")]
fn masks(block: &[u8; 64]) -> Masks {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_setzero_si128,
    };
    let mut masks = Masks::default();
    // SAFETY: SSE2 is part of every x86_64 processor (the intrinsics need no check), and each
    // load reads 16 bytes inside the 64-byte block (unaligned loads allowed).
    unsafe {
        let (backslash, quote, control) = (_mm_set1_epi8(b'\\' as i8), _mm_set1_epi8(b'"' as i8), _mm_set1_epi8(0x1f));
        let mut low = _mm_setzero_si128();
        for lane in 0..4 {
            let bytes = _mm_loadu_si128(block.as_ptr().add(16 * lane).cast::<__m128i>());
            let bits = |equal: i32| u64::from(equal as u16) << (16 * lane);
            masks.backslash |= bits(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, backslash)));
            masks.quote |= bits(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, quote)));
            // Unsigned max(byte, 0x1f) == 0x1f: the byte is at most 0x1f.
            low = _mm_or_si128(low, _mm_cmpeq_epi8(_mm_max_epu8(bytes, control), control));
        }
        masks.control = _mm_movemask_epi8(low) != 0;
    }
    masks
}

/// The block's masks a byte at a time (where SSE2 is not there; the tests' reference).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn masks_by_byte(block: &[u8; 64]) -> Masks {
    let bits = |test: fn(u8) -> bool| {
        block.iter().enumerate().fold(0u64, |bits, (at, &byte)| bits | u64::from(test(byte)) << at)
    };
    Masks {
        backslash: bits(|byte| byte == b'\\'),
        quote: bits(|byte| byte == b'"'),
        control: block.iter().any(|&byte| byte < 0x20),
    }
}

#[cfg(not(target_arch = "x86_64"))]
use masks_by_byte as masks;

#[cfg(test)]
mod tests;
