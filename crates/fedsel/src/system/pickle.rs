//! A small pickle reader for FedScale's device files, as Python scripts write them: Python
//! numbers, strings, bytes, lists, tuples and dicts, and NumPy scalars and 1-D arrays.
//!
//! serde-pickle reads plain data, but a NumPy scalar (`numpy.float64(3.5)`) pickles as
//! `numpy.core.multiarray.scalar(numpy.dtype('f8', False, True), b'raw bytes')` (numpy 1.x;
//! `numpy._core.multiarray.scalar` with numpy 2.x), with the dtype's byte order set by a
//! BUILD opcode afterwards, and serde-pickle's BUILD replaces the dtype with that state, so
//! the `'f8'` is lost. This reader runs the pickle machine itself and knows these
//! constructors:
//! - `numpy.[_]core.multiarray.scalar(dtype, bytes)`: a scalar of type bool, int8..int64,
//!   uint8..uint64, float32 or float64 becomes a Python bool, int or float;
//! - `numpy.[_]core.multiarray._reconstruct(ndarray, (0,), b'b')` with its BUILD state
//!   `(1, shape, dtype, is_fortran, raw)` (protocols 0-4) and
//!   `numpy.[_]core.numeric._frombuffer(raw, dtype, shape, order)` (protocol 5): a 1-D
//!   (or 0-D) array of those types becomes a list;
//! - `_codecs.encode(text, 'latin1')` (how protocols 0-2 write bytes): bytes.
//!
//! Anything else, including other NumPy types (float16, complex, strings, objects,
//! arrays of more than one dimension), is refused with an error that names it and says
//! how to write the file with plain Python values (`.item()`, `.tolist()`). The result is
//! a serde-pickle [`Value`]; the top-level dict's entries come in the file's order.

use std::collections::HashMap;
use std::rc::Rc;

use serde_pickle::Value;

/// How to write a file fedsel reads, named in refusals.
const CONVERT: &str = "write the file with plain Python values: `x.item()` for a NumPy scalar, `a.tolist()` for an array";

/// Nested containers deeper than this are refused (the conversion recurses).
const MAX_DEPTH: usize = 256;

/// A dtype's `(kind, size)`, with its byte order.
#[derive(Clone, Debug, PartialEq)]
struct Dtype {
    /// The type string as pickled: `f8`, `i8`, `b1`, `u4`, ...
    code: String,
    /// `<`, `>`, `|` or `=`, from the BUILD state (`<` until then... numpy writes one).
    order: u8,
}

#[derive(Clone, Debug)]
enum Obj {
    Mark,
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    /// A tuple and how deeply tuples nest in it (dropping one recurses).
    Tuple(Rc<[Obj]>, usize),
    /// A list or a dict in the arena, by index, so that a memoized one is shared.
    List(usize),
    Dict(usize),
    Global(Rc<str>, Rc<str>),
    Dtype(Rc<Dtype>),
    /// `ndarray` made by `_reconstruct`, awaiting its BUILD state.
    Array,
}

enum Node {
    List(Vec<Obj>),
    Dict(Vec<(Obj, Obj)>),
}

fn numpy_module(module: &str, tail: &str) -> bool {
    module
        .strip_prefix("numpy.core.")
        .or_else(|| module.strip_prefix("numpy._core."))
        == Some(tail)
}

/// NumPy's name of a dtype code, for messages.
fn type_name(d: &Dtype) -> String {
    let name = match d.code.as_str() {
        "b1" => "bool",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "f16" => "longdouble",
        "c8" => "complex64",
        "c16" => "complex128",
        "O8" | "O4" => "object",
        other => return format!("dtype('{other}')"),
    };
    format!("numpy.{name}")
}

/// Decodes the values of dtype `d` packed in `raw`.
fn decode(d: &Dtype, raw: &[u8]) -> Result<Vec<Obj>, String> {
    let size: usize = match d.code.as_str() {
        "b1" | "i1" | "u1" => 1,
        "i2" | "u2" => 2,
        "i4" | "u4" | "f4" => 4,
        "i8" | "u8" | "f8" => 8,
        _ => {
            return Err(format!(
                "a {} value, which fedsel does not read; {CONVERT}",
                type_name(d)
            ));
        }
    };
    let big = match d.order {
        b'>' => true,
        b'<' | b'|' => false,
        b'=' => cfg!(target_endian = "big"),
        o => {
            return Err(format!(
                "a {} with byte order {:?}",
                type_name(d),
                o as char
            ));
        }
    };
    if !raw.len().is_multiple_of(size) {
        return Err(format!(
            "{} bytes of {} values, not a whole number of them",
            raw.len(),
            type_name(d)
        ));
    }
    raw.chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            if big {
                b[..size].reverse();
            }
            let u = u64::from_le_bytes(b);
            let shift = 64 - 8 * size as u32;
            Ok(match d.code.as_str() {
                "b1" => Obj::Bool(u != 0),
                "i1" | "i2" | "i4" | "i8" => Obj::Int(((u << shift) as i64) >> shift),
                "u1" | "u2" | "u4" => Obj::Int(u as i64),
                "u8" => Obj::Int(
                    i64::try_from(u)
                        .map_err(|_| format!("a numpy.uint64 {u} beyond int64; {CONVERT}"))?,
                ),
                "f4" => Obj::Float(f32::from_bits(u as u32) as f64),
                _ => Obj::Float(f64::from_bits(u)),
            })
        })
        .collect()
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Obj>,
    memo: HashMap<u64, Obj>,
    arena: Vec<Node>,
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(format!(
                "the pickle ends inside an opcode at byte {}",
                self.pos
            ));
        };
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(self.take(n)?);
        Ok(u64::from_le_bytes(b))
    }

    fn len(&mut self, n: usize) -> Result<usize, String> {
        let len = self.uint(n)?;
        usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.data.len() - self.pos)
            .ok_or_else(|| {
                format!(
                    "a length of {len} bytes beyond the file's end at byte {}",
                    self.pos
                )
            })
    }

    fn line_bytes(&mut self) -> Result<&'a [u8], String> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("a text opcode without its newline")?;
        self.pos += end + 1;
        Ok(&rest[..end])
    }

    fn line(&mut self) -> Result<&'a str, String> {
        std::str::from_utf8(self.line_bytes()?)
            .map_err(|_| "a text opcode's argument is not UTF-8".to_string())
    }

    fn pop(&mut self) -> Result<Obj, String> {
        match self.stack.pop() {
            Some(Obj::Mark) | None => Err(format!("the stack is empty at byte {}", self.pos)),
            Some(o) => Ok(o),
        }
    }

    fn top(&mut self) -> Result<&mut Obj, String> {
        match self.stack.last_mut() {
            Some(Obj::Mark) | None => Err(format!("the stack is empty at byte {}", self.pos)),
            Some(o) => Ok(o),
        }
    }

    /// The items above the topmost mark, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Obj>, String> {
        let at = self
            .stack
            .iter()
            .rposition(|o| matches!(o, Obj::Mark))
            .ok_or("no mark on the stack")?;
        let items = self.stack.split_off(at + 1);
        self.stack.pop();
        Ok(items)
    }

    fn push_tuple(&mut self, items: Vec<Obj>) -> Result<(), String> {
        let depth = 1 + items
            .iter()
            .map(|o| if let Obj::Tuple(_, d) = o { *d } else { 0 })
            .max()
            .unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(format!("tuples nested deeper than {MAX_DEPTH}"));
        }
        self.stack.push(Obj::Tuple(items.into(), depth));
        Ok(())
    }

    fn push_list(&mut self, items: Vec<Obj>) {
        self.arena.push(Node::List(items));
        self.stack.push(Obj::List(self.arena.len() - 1));
    }

    fn push_dict(&mut self, items: Vec<(Obj, Obj)>) {
        self.arena.push(Node::Dict(items));
        self.stack.push(Obj::Dict(self.arena.len() - 1));
    }

    fn extend_list(&mut self, target: &Obj, items: Vec<Obj>) -> Result<(), String> {
        match target {
            Obj::List(i) => {
                if let Node::List(l) = &mut self.arena[*i] {
                    l.extend(items);
                }
                Ok(())
            }
            _ => Err("APPEND to something not a list".into()),
        }
    }

    fn set_items(&mut self, target: &Obj, items: Vec<Obj>) -> Result<(), String> {
        if !items.len().is_multiple_of(2) {
            return Err("SETITEMS with an odd number of items".into());
        }
        let Obj::Dict(i) = target else {
            return Err("SETITEM to something not a dict".into());
        };
        let Node::Dict(d) = &mut self.arena[*i] else {
            unreachable!()
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    fn memo_get(&mut self, id: u64) -> Result<(), String> {
        let o = self
            .memo
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("memo {id} is read before it is written"))?;
        self.stack.push(o);
        Ok(())
    }

    fn memo_put(&mut self, id: u64) -> Result<(), String> {
        let o = self.top()?.clone();
        self.memo.insert(id, o);
        Ok(())
    }

    fn int_line(s: &str) -> Result<Obj, String> {
        let t = s.trim_end_matches('L');
        match t {
            "00" => return Ok(Obj::Bool(false)),
            "01" => return Ok(Obj::Bool(true)),
            _ => {}
        }
        t.parse::<i64>()
            .map(Obj::Int)
            .map_err(|_| format!("the integer {s:?} is not one fedsel reads (64 bits)"))
    }

    /// A string in Python's quoted repr (protocol 0 STRING), as bytes.
    fn quoted(s: &str) -> Result<Obj, String> {
        let b = s.as_bytes();
        if b.len() < 2 || b[0] != b[b.len() - 1] || !matches!(b[0], b'\'' | b'"') {
            return Err(format!("the STRING argument {s:?} is not quoted"));
        }
        let mut out = Vec::new();
        let mut it = b[1..b.len() - 1].iter().copied();
        while let Some(c) = it.next() {
            if c != b'\\' {
                out.push(c);
                continue;
            }
            match it.next() {
                Some(b'n') => out.push(b'\n'),
                Some(b'r') => out.push(b'\r'),
                Some(b't') => out.push(b'\t'),
                Some(b'x') => {
                    let h: Vec<u8> = it.by_ref().take(2).collect();
                    let v = std::str::from_utf8(&h)
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok());
                    out.push(v.ok_or("a bad \\x escape in a STRING")?);
                }
                Some(c @ (b'\\' | b'\'' | b'"')) => out.push(c),
                _ => return Err("an escape fedsel does not read in a STRING".into()),
            }
        }
        Ok(Obj::Bytes(out.into()))
    }

    /// Protocol 0's UNICODE argument (raw-unicode-escape).
    /// (Latin-1 bytes, with `\\u` escapes for the other characters.)
    fn raw_unicode(s: &[u8]) -> Result<Obj, String> {
        let mut out = String::new();
        let mut chars = s.iter().map(|&b| char::from(b)).peekable();
        while let Some(c) = chars.next() {
            if c == '\\' && matches!(chars.peek(), Some('u' | 'U')) {
                let n = if chars.next() == Some('u') { 4 } else { 8 };
                let h: String = chars.by_ref().take(n).collect();
                let v = u32::from_str_radix(&h, 16).ok().and_then(char::from_u32);
                out.push(v.ok_or("a bad \\u escape in a UNICODE")?);
            } else {
                out.push(c);
            }
        }
        Ok(Obj::Str(out.into()))
    }

    fn text(bytes: &[u8]) -> Result<Obj, String> {
        std::str::from_utf8(bytes)
            .map(|s| Obj::Str(s.into()))
            .map_err(|_| "a string that is not UTF-8".to_string())
    }

    fn reduce(&mut self) -> Result<(), String> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let Obj::Tuple(args, _) = args else {
            return Err("REDUCE's arguments are not a tuple".into());
        };
        let Obj::Global(module, name) = callable else {
            return Err("REDUCE calls something not a global".into());
        };
        let result = match (&*module, &*name, &args[..]) {
            ("numpy", "dtype", [Obj::Str(code), ..]) => Obj::Dtype(Rc::new(Dtype {
                code: code.to_string(),
                order: b'|',
            })),
            (m, "scalar", [Obj::Dtype(d), Obj::Bytes(raw)]) if numpy_module(m, "multiarray") => {
                let mut v = decode(d, raw).map_err(|e| format!("a NumPy scalar: {e}"))?;
                if v.len() != 1 {
                    return Err(format!("a {} scalar of {} bytes", type_name(d), raw.len()));
                }
                v.pop().unwrap()
            }
            (m, "scalar", [Obj::Dtype(d), ..]) if numpy_module(m, "multiarray") => {
                return Err(format!(
                    "a {} scalar, which fedsel does not read; {CONVERT}",
                    type_name(d)
                ));
            }
            (m, "_reconstruct", _) if numpy_module(m, "multiarray") => Obj::Array,
            (m, "_frombuffer", [Obj::Bytes(raw), Obj::Dtype(d), Obj::Tuple(shape, _), _])
                if numpy_module(m, "numeric") =>
            {
                self.array(d, shape, raw)?
            }
            ("_codecs", "encode", [Obj::Str(s), Obj::Str(enc)])
                if &**enc == "latin1" || &**enc == "latin-1" =>
            {
                let bytes: Option<Vec<u8>> =
                    s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
                Obj::Bytes(
                    bytes
                        .ok_or("_codecs.encode of a character beyond latin-1")?
                        .into(),
                )
            }
            ("builtins" | "__builtin__", "bytearray" | "bytes", [Obj::Bytes(b)]) => {
                Obj::Bytes(b.clone())
            }
            ("builtins" | "__builtin__", "bytearray" | "bytes", []) => {
                Obj::Bytes(Rc::from(&[][..]))
            }
            (m, n, _) if m == "numpy" || m.starts_with("numpy.") => {
                return Err(format!(
                    "a pickled NumPy object `{m}.{n}` fedsel does not read; {CONVERT}"
                ));
            }
            (m, n, _) => {
                return Err(format!(
                    "a pickled `{m}.{n}` object: fedsel reads Python numbers, strings, lists, tuples and dicts, and NumPy scalars and 1-D arrays of bool, int and float"
                ));
            }
        };
        self.stack.push(result);
        Ok(())
    }

    /// A 1-D (or 0-D) array of `shape` and dtype `d` from its raw bytes, as a list.
    fn array(&mut self, d: &Dtype, shape: &[Obj], raw: &[u8]) -> Result<Obj, String> {
        let dims: Vec<i64> = shape
            .iter()
            .map(|s| match s {
                Obj::Int(i) => Ok(*i),
                _ => Err("a NumPy array whose shape is not integers".to_string()),
            })
            .collect::<Result<_, _>>()?;
        if dims.len() > 1 {
            return Err(format!(
                "a NumPy array of shape {dims:?}: fedsel reads 1-D arrays; {CONVERT}"
            ));
        }
        let values = decode(d, raw).map_err(|e| format!("a NumPy array: {e}"))?;
        let want = dims.first().copied().unwrap_or(1);
        if values.len() as i64 != want {
            return Err(format!(
                "a NumPy array of shape {dims:?} with {} values",
                values.len()
            ));
        }
        self.arena.push(Node::List(values));
        Ok(Obj::List(self.arena.len() - 1))
    }

    fn build(&mut self) -> Result<(), String> {
        let state = self.pop()?;
        let target = self.pop()?;
        let built = match (target, state) {
            (Obj::Dtype(d), Obj::Tuple(s, _)) => {
                let order = match s.get(1) {
                    Some(Obj::Str(o)) if o.len() == 1 => o.as_bytes()[0],
                    _ => {
                        return Err(format!(
                            "a {} dtype with a state fedsel does not read",
                            type_name(&d)
                        ));
                    }
                };
                Obj::Dtype(Rc::new(Dtype {
                    order,
                    ..(*d).clone()
                }))
            }
            (Obj::Array, Obj::Tuple(s, _)) => match &s[..] {
                [_, Obj::Tuple(shape, _), Obj::Dtype(d), _, Obj::Bytes(raw)] => {
                    self.array(d, shape, raw)?
                }
                [_, _, Obj::Dtype(d), ..] => {
                    return Err(format!(
                        "a NumPy array of {} fedsel does not read; {CONVERT}",
                        type_name(d)
                    ));
                }
                _ => return Err("a NumPy array with a state fedsel does not read".into()),
            },
            _ => {
                return Err(
                    "a BUILD opcode for an object fedsel does not read (a class instance)".into(),
                );
            }
        };
        self.stack.push(built);
        Ok(())
    }

    fn run(&mut self) -> Result<Obj, String> {
        loop {
            let op = self.byte()?;
            match op {
                b'.' => return self.pop(),
                b'(' => self.stack.push(Obj::Mark),
                b'0' => {
                    self.stack.pop().ok_or("POP on an empty stack")?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let o = self.top()?.clone();
                    self.stack.push(o);
                }
                0x80 => {
                    let p = self.byte()?;
                    if p > 5 {
                        return Err(format!("pickle protocol {p}, newer than 5"));
                    }
                }
                0x95 => {
                    self.take(8)?;
                }
                0x98 => {} // READONLY_BUFFER
                b'N' => self.stack.push(Obj::None),
                0x88 => self.stack.push(Obj::Bool(true)),
                0x89 => self.stack.push(Obj::Bool(false)),
                b'I' => {
                    let l = self.line()?;
                    self.stack.push(Self::int_line(l)?);
                }
                b'L' => {
                    let l = self.line()?;
                    self.stack.push(Self::int_line(l)?);
                }
                b'J' => {
                    let v = self.uint(4)? as u32 as i32;
                    self.stack.push(Obj::Int(v.into()));
                }
                b'K' => {
                    let v = self.uint(1)?;
                    self.stack.push(Obj::Int(v as i64));
                }
                b'M' => {
                    let v = self.uint(2)?;
                    self.stack.push(Obj::Int(v as i64));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.len(1)?
                    } else {
                        self.len(4)?
                    };
                    let b = self.take(n)?;
                    if n > 8 {
                        return Err(format!(
                            "an integer of {n} bytes: fedsel reads 64-bit integers"
                        ));
                    }
                    let mut v = [if b.last().is_some_and(|&x| x & 0x80 != 0) {
                        0xff
                    } else {
                        0
                    }; 8];
                    v[..n].copy_from_slice(b);
                    self.stack.push(Obj::Int(i64::from_le_bytes(v)));
                }
                b'F' => {
                    let l = self.line()?;
                    let x = l
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| format!("the float {l:?}"))?;
                    self.stack.push(Obj::Float(x));
                }
                b'G' => {
                    let b: [u8; 8] = self.take(8)?.try_into().unwrap();
                    self.stack.push(Obj::Float(f64::from_be_bytes(b)));
                }
                b'S' => {
                    let l = self.line()?;
                    self.stack.push(Self::quoted(l)?);
                }
                b'V' => {
                    let l = self.line_bytes()?;
                    self.stack.push(Self::raw_unicode(l)?);
                }
                b'T' | b'U' | b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'U' | b'C' => self.len(1)?,
                        b'T' | b'B' => self.len(4)?,
                        _ => self.len(8)?,
                    };
                    let b = self.take(n)?;
                    self.stack.push(Obj::Bytes(b.into()));
                }
                b'X' | 0x8c | 0x8d => {
                    let n = match op {
                        0x8c => self.len(1)?,
                        b'X' => self.len(4)?,
                        _ => self.len(8)?,
                    };
                    let b = self.take(n)?;
                    self.stack.push(Self::text(b)?);
                }
                b')' => self.stack.push(Obj::Tuple(Rc::from(Vec::new()), 1)),
                b't' => {
                    let items = self.pop_mark()?;
                    self.push_tuple(items)?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = (0..n).map(|_| self.pop()).collect::<Result<Vec<_>, _>>()?;
                    items.reverse();
                    self.push_tuple(items)?;
                }
                b']' => self.push_list(Vec::new()),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push_list(items);
                }
                b'a' => {
                    let v = self.pop()?;
                    let l = self.top()?.clone();
                    self.extend_list(&l, vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let l = self.top()?.clone();
                    self.extend_list(&l, items)?;
                }
                b'}' => self.push_dict(Vec::new()),
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push_dict(Vec::new());
                    let d = self.top()?.clone();
                    self.set_items(&d, items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let d = self.top()?.clone();
                    self.set_items(&d, vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let d = self.top()?.clone();
                    self.set_items(&d, items)?;
                }
                b'p' => {
                    let l = self.line()?;
                    let id = l.parse().map_err(|_| format!("the memo id {l:?}"))?;
                    self.memo_put(id)?;
                }
                b'q' => {
                    let id = self.uint(1)?;
                    self.memo_put(id)?;
                }
                b'r' => {
                    let id = self.uint(4)?;
                    self.memo_put(id)?;
                }
                0x94 => {
                    let id = self.memo.len() as u64;
                    self.memo_put(id)?;
                }
                b'g' => {
                    let l = self.line()?;
                    let id = l.parse().map_err(|_| format!("the memo id {l:?}"))?;
                    self.memo_get(id)?;
                }
                b'h' => {
                    let id = self.uint(1)?;
                    self.memo_get(id)?;
                }
                b'j' => {
                    let id = self.uint(4)?;
                    self.memo_get(id)?;
                }
                b'c' => {
                    let m = self.line()?;
                    let n = self.line()?;
                    self.stack.push(Obj::Global(m.into(), n.into()));
                }
                0x93 => {
                    let n = self.pop()?;
                    let m = self.pop()?;
                    let (Obj::Str(m), Obj::Str(n)) = (m, n) else {
                        return Err("STACK_GLOBAL of something not two strings".into());
                    };
                    self.stack.push(Obj::Global(m, n));
                }
                b'R' => self.reduce()?,
                b'b' => self.build()?,
                other => {
                    return Err(format!(
                        "opcode {other:#04x} at byte {}, which fedsel does not read (sets, class instances, persistent ids or out-of-band buffers)",
                        self.pos - 1
                    ));
                }
            }
        }
    }

    /// `o` as a serde-pickle value; `budget` bounds the nodes made (memo references can
    /// share one object many times over).
    fn value(&self, o: &Obj, depth: usize, budget: &mut usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(format!("containers nested deeper than {MAX_DEPTH}"));
        }
        *budget = budget
            .checked_sub(1)
            .ok_or("more values than the file could hold without sharing")?;
        Ok(match o {
            Obj::None => Value::None,
            Obj::Bool(b) => Value::Bool(*b),
            Obj::Int(i) => Value::I64(*i),
            Obj::Float(x) => Value::F64(*x),
            Obj::Str(s) => {
                *budget = budget.saturating_sub(s.len() / 16);
                Value::String(s.to_string())
            }
            Obj::Bytes(b) => {
                *budget = budget.saturating_sub(b.len() / 16);
                Value::Bytes(b.to_vec())
            }
            Obj::Tuple(t, _) => Value::Tuple(
                t.iter()
                    .map(|x| self.value(x, depth + 1, budget))
                    .collect::<Result<_, _>>()?,
            ),
            Obj::List(i) => match &self.arena[*i] {
                Node::List(l) => Value::List(
                    l.iter()
                        .map(|x| self.value(x, depth + 1, budget))
                        .collect::<Result<_, _>>()?,
                ),
                Node::Dict(_) => unreachable!(),
            },
            Obj::Dict(_) => {
                let mut map = std::collections::BTreeMap::new();
                for (k, v) in self.entries(o, depth, budget)? {
                    let k = k
                        .into_hashable()
                        .map_err(|_| "a dict key that is not hashable".to_string())?;
                    map.insert(k, v);
                }
                Value::Dict(map)
            }
            Obj::Dtype(d) => return Err(format!("a bare {} dtype", type_name(d))),
            Obj::Global(m, n) => return Err(format!("a bare reference to `{m}.{n}`")),
            Obj::Array => return Err("a NumPy array without its data".into()),
            Obj::Mark => return Err("a mark left on the stack".into()),
        })
    }

    fn entries(
        &self,
        o: &Obj,
        depth: usize,
        budget: &mut usize,
    ) -> Result<Vec<(Value, Value)>, String> {
        let Obj::Dict(i) = o else {
            return Err(format!("the pickle holds {}, not a dict", kind(o)));
        };
        let Node::Dict(d) = &self.arena[*i] else {
            unreachable!()
        };
        d.iter()
            .map(|(k, v)| {
                Ok((
                    self.value(k, depth + 1, budget)?,
                    self.value(v, depth + 1, budget)?,
                ))
            })
            .collect()
    }
}

fn kind(o: &Obj) -> &'static str {
    match o {
        Obj::None => "None",
        Obj::Bool(_) => "a bool",
        Obj::Int(_) => "an int",
        Obj::Float(_) => "a float",
        Obj::Str(_) => "a string",
        Obj::Bytes(_) => "bytes",
        Obj::Tuple(..) => "a tuple",
        Obj::List(_) => "a list",
        Obj::Dict(_) => "a dict",
        _ => "an object",
    }
}

/// The entries, in the file's order, of the dict pickled in `bytes`.
pub fn dict_entries(bytes: &[u8]) -> Result<Vec<(Value, Value)>, String> {
    let mut m = Machine {
        data: bytes,
        pos: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        arena: Vec::new(),
    };
    let root = m.run()?;
    let mut budget = bytes.len().saturating_mul(4).saturating_add(1024);
    m.entries(&root, 0, &mut budget)
}
