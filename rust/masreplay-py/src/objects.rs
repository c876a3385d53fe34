//! Python objects (dicts, lists, numbers, ...) -> JSON values, with the JSON pointer of any
//! value JSON cannot hold (NaN, infinities, non-string keys, foreign types) or that nests deeper
//! than a trace may ([`MAX_DEPTH`], which also ends a dict or list that contains itself).
//! Python code runs while a value is read (`__index__`, `__float__`, `__iter__`), and it may
//! change the containers: a dict is read from a snapshot of its items, never iterated live.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use masreplay_core::validate::{MAX_DEPTH, depth_error, pointer_segment};

/// Where and why a Python object is not JSON.
pub struct NotJson {
    pub path: String,
    pub reason: String,
}

/// The JSON value of a trace object (level 1 of [`MAX_DEPTH`]).
pub fn trace_to_json(object: &Bound<'_, PyAny>) -> Result<Value, NotJson> {
    to_json(object, &mut String::new(), 1)
}

/// `object` at nesting `level` (the trace object is level 1), its pointer in `path`.
fn to_json(object: &Bound<'_, PyAny>, path: &mut String, level: usize) -> Result<Value, NotJson> {
    let fail = |path: &str, reason: String| NotJson { path: path.to_owned(), reason };
    if object.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(flag) = object.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if let Ok(text) = object.cast::<PyString>() {
        let text = text.to_str().map_err(|e| fail(path, format!("string is not valid UTF-8: {e}")))?;
        return Ok(Value::String(text.to_owned()));
    }
    if let Ok(float) = object.cast::<PyFloat>() {
        return float_value(float.value())
            .ok_or_else(|| fail(path, format!("{} is not a finite number", float.value())));
    }
    if object.cast::<PyInt>().is_ok() || object.hasattr("__index__").unwrap_or(false) {
        if let Ok(n) = object.extract::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        if let Ok(n) = object.extract::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        // Wider integers become the nearest double, as a JSON parser reads them.
        let wide: f64 = object.extract().map_err(|e: PyErr| fail(path, e.to_string()))?;
        return float_value(wide).ok_or_else(|| fail(path, format!("{wide} is not a finite number")));
    }
    let container =
        object.cast::<PyDict>().is_ok() || object.cast::<PyList>().is_ok() || object.cast::<PyTuple>().is_ok();
    if container && level > MAX_DEPTH {
        return Err(fail(path, depth_error()));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let items = dict.items();
        let mut map = Map::with_capacity(items.len());
        for item in items.iter() {
            let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                item.extract().map_err(|e: PyErr| fail(path, e.to_string()))?;
            let Ok(key) = key.cast::<PyString>() else {
                return Err(fail(path, format!("object keys must be strings, got {}", type_name(&key))));
            };
            let key = key.to_string();
            let depth = path.len();
            path.push('/');
            path.push_str(&pointer_segment(&key));
            let value = to_json(&value, path, level + 1)?;
            path.truncate(depth);
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if object.cast::<PyList>().is_ok() || object.cast::<PyTuple>().is_ok() {
        let mut items = Vec::new();
        for (i, item) in object.try_iter().map_err(|e| fail(path, e.to_string()))?.enumerate() {
            let item = item.map_err(|e| fail(path, e.to_string()))?;
            let depth = path.len();
            path.push('/');
            path.push_str(&i.to_string());
            items.push(to_json(&item, path, level + 1)?);
            path.truncate(depth);
        }
        return Ok(Value::Array(items));
    }
    if object.hasattr("__float__").unwrap_or(false) {
        let value: f64 = object.extract().map_err(|e: PyErr| fail(path, e.to_string()))?;
        return float_value(value).ok_or_else(|| fail(path, format!("{value} is not a finite number")));
    }
    Err(fail(path, format!("{} is not a JSON value", type_name(object))))
}

fn float_value(value: f64) -> Option<Value> {
    Number::from_f64(value).map(Value::Number)
}

fn type_name(object: &Bound<'_, PyAny>) -> String {
    object.get_type().name().map(|n| format!("a value of type {n}")).unwrap_or_else(|_| "a value".into())
}
