//! Python values to TOML: a config dict becomes the table a TOML file would give.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::py_err;

/// The TOML table of a config dict. A dotted key (`"train.lr"`) stands for nested tables,
/// as it does in TOML; `prefix` is the key path so far, for error messages.
pub fn table(d: &Bound<'_, PyDict>, prefix: &str) -> PyResult<toml::Table> {
    let mut out = toml::Table::new();
    for (k, v) in d.iter() {
        let k: String = k
            .extract()
            .map_err(|_| py_err(format!("config keys must be strings (under `{prefix}`)")))?;
        let full = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let value = value(&v, &full)?;
        let mut parts: Vec<&str> = k.split('.').collect();
        let last = parts.pop().expect("split yields at least one part");
        let mut at = &mut out;
        for p in parts {
            at = at
                .entry(p)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| py_err(format!("config key `{full}`: `{p}` is not a table")))?;
        }
        match (at.get_mut(last), value) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new)) => old.extend(new),
            (_, value) => {
                at.insert(last.to_string(), value);
            }
        }
    }
    Ok(out)
}

/// One Python value as TOML; `key` names it in errors.
pub fn value(v: &Bound<'_, PyAny>, key: &str) -> PyResult<toml::Value> {
    // bool before int: Python's bool is an int.
    if v.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(toml::Value::Integer(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(toml::Value::String(v.extract()?));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        return Ok(toml::Value::Table(table(d, key)?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items = v
            .try_iter()?
            .enumerate()
            .map(|(i, x)| value(&x?, &format!("{key}[{i}]")))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(toml::Value::Array(items));
    }
    if v.hasattr("__fspath__")? {
        let p: std::path::PathBuf = v.extract()?;
        return Ok(toml::Value::String(p.display().to_string()));
    }
    // NumPy scalars and other numbers: anything with __index__ is an integer, with
    // __float__ a float.
    if v.hasattr("__index__")? {
        return Ok(toml::Value::Integer(
            v.call_method0("__index__")?.extract()?,
        ));
    }
    if v.hasattr("__float__")? {
        return Ok(toml::Value::Float(v.call_method0("__float__")?.extract()?));
    }
    Err(py_err(format!(
        "config key `{key}`: a {} is not a TOML value",
        v.get_type().name()?
    )))
}
