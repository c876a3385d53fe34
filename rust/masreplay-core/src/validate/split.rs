//! Cuts a JSON document into the texts of its traces without parsing them, so that they can be
//! parsed in parallel. Only the skeleton is checked here (objects, arrays of objects, commas and
//! whitespace between them); each piece is then parsed in full, and a document whose pieces all
//! parse is valid JSON whose traces are exactly these pieces.

/// A trace nests at most this deep (the Reader words the error of one that nests deeper);
/// below serde_json's recursion limit (128), so a trace nests within it the same way alone as
/// inside its document's array.
use super::MAX_DEPTH;

/// The trace texts of a document made of objects and arrays of objects (the shapes whose items
/// the Reader checks one by one), found lazily so that parsing can start before the cutting
/// ends. An item `None` says the document has another shape (it is left to the Reader); it is
/// the last item.
pub(super) fn trace_texts(bytes: &[u8]) -> TraceTexts<'_> {
    TraceTexts { bytes, at: 0, place: Place::TopLevel }
}

pub(super) struct TraceTexts<'a> {
    bytes: &'a [u8],
    at: usize,
    place: Place,
}

#[derive(Clone, Copy)]
enum Place {
    TopLevel,
    /// Just after the `[` of an array: an item or `]` comes next.
    ArrayStart,
    /// After an item of an array: `,` or `]`.
    ArrayItem,
    /// After a `,` in an array: an item.
    ArrayComma,
    Done,
}

impl<'a> Iterator for TraceTexts<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Option<&'a [u8]>> {
        let found = self.find();
        if !matches!(found, Some(Some(_))) {
            self.place = Place::Done;
        }
        found
    }
}

impl<'a> TraceTexts<'a> {
    fn find(&mut self) -> Option<Option<&'a [u8]>> {
        let bytes = self.bytes;
        loop {
            let at = skip_whitespace(bytes, self.at);
            self.at = at + 1;
            self.place = match (self.place, bytes.get(at)) {
                (Place::Done, _) | (Place::TopLevel, None) => return None,
                (Place::TopLevel, Some(b'[')) => Place::ArrayStart,
                (Place::ArrayStart | Place::ArrayItem, Some(b']')) => Place::TopLevel,
                (Place::ArrayItem, Some(b',')) => Place::ArrayComma,
                (place @ (Place::TopLevel | Place::ArrayStart | Place::ArrayComma), Some(b'{')) => {
                    let Some(end) = object_end(bytes, at) else { return Some(None) };
                    self.at = end;
                    if !matches!(place, Place::TopLevel) {
                        self.place = Place::ArrayItem;
                    }
                    return Some(Some(&bytes[at..end]));
                }
                _ => return Some(None),
            };
        }
    }
}

/// JSON whitespace, as serde_json skips it.
fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\n' | b'\t' | b'\r')) {
        at += 1;
    }
    at
}

/// The end of the object opening at `start`, found by counting brackets outside strings.
fn object_end(bytes: &[u8], start: usize) -> Option<usize> {
    if bytes.get(start) != Some(&b'{') {
        return None;
    }
    let mut depth = 0;
    let mut at = start;
    while at < bytes.len() {
        match bytes[at] {
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return None;
                }
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            b'"' => at = string_end(bytes, at + 1)?,
            _ => {}
        }
        at += 1;
    }
    None
}

/// The position of the quote that closes the string whose content starts at `at`.
fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at += memchr::memchr2(b'"', b'\\', &bytes[at..])?;
        if bytes[at] == b'"' {
            return Some(at);
        }
        at += 2; // the backslash and the character it escapes
        if at > bytes.len() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(document: &str) -> Option<Vec<&str>> {
        trace_texts(document.as_bytes()).map(|text| text.map(|t| std::str::from_utf8(t).unwrap())).collect()
    }

    #[test]
    fn objects_and_arrays_of_objects() {
        assert_eq!(
            texts(" [ {\"a\": [1, {}]} ,{\"b\":\"]}\"}\n]{\"c\":1} "),
            Some(vec!["{\"a\": [1, {}]}", "{\"b\":\"]}\"}", "{\"c\":1}"])
        );
        assert_eq!(texts("{\"a\":\"\\\"}\"}"), Some(vec!["{\"a\":\"\\\"}\"}"]));
        assert_eq!(texts("[]"), Some(vec![]));
        assert_eq!(texts(""), Some(vec![]));
    }

    #[test]
    fn other_shapes_are_left_to_the_reader() {
        for document in
            ["[1]", "[{},]", "[{} {}]", "{},{}", "\"x\"", "{\"a\":\"x", "{\"a\":\"\\", "[{}", "{", "[{\"a\":1}}"]
        {
            assert_eq!(texts(document), None, "{document}");
        }
        let deep = format!("[{{\"a\":{}{}}}]", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(texts(&deep), None);
    }
}
