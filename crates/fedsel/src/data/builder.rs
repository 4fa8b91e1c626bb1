//! A dataset assembled one example at a time, for the formats that store examples as JSON
//! rows (LEAF, FLGo): the first example fixes the kind of input and its length, and every
//! later one must match it, so a ragged file is refused where it is read, not at training.

use std::path::Path;

use super::{Dataset, Inputs};
use crate::data::shakespeare::VOCAB;
use crate::error::DataError;

/// One example's input as a JSON file holds it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum RawInput {
    /// A feature vector, possibly nested (an image as rows of pixels): flattened in order.
    Numbers(NestedNumbers),
    /// A character sequence, read as ids into LEAF's vocabulary.
    Text(String),
}

/// A number or an array of them, at any depth.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum NestedNumbers {
    /// One value.
    Scalar(f32),
    /// An array.
    Array(Vec<NestedNumbers>),
}

impl NestedNumbers {
    /// The values in row-major order, and the shape the nesting gives (`[]` for a scalar).
    fn flatten(&self, values: &mut Vec<f32>) -> Result<Vec<usize>, String> {
        match self {
            Self::Scalar(v) => {
                values.push(*v);
                Ok(Vec::new())
            }
            Self::Array(items) => {
                let mut inner: Option<Vec<usize>> = None;
                for item in items {
                    let s = item.flatten(values)?;
                    match &inner {
                        Some(first) if *first != s => {
                            return Err(format!(
                                "a ragged array (elements of shape {first:?} and {s:?})"
                            ));
                        }
                        Some(_) => {}
                        None => inner = Some(s),
                    }
                }
                let mut shape = vec![items.len()];
                shape.extend(inner.unwrap_or_default());
                Ok(shape)
            }
        }
    }
}

/// One example's label as a JSON file holds it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(untagged)]
pub enum RawLabel {
    /// A class index.
    Class(u64),
    /// A class index written as a float (numpy arrays dumped as floats): must be integral.
    Float(f64),
    /// One character: the next character of a text sequence.
    Text(String),
}

/// The examples read so far.
#[derive(Debug, Default)]
pub struct DatasetBuilder {
    shape: Option<Vec<usize>>,
    tokens: bool,
    dense: Vec<f32>,
    text: Vec<u8>,
    labels: Vec<u32>,
}

impl DatasetBuilder {
    /// Number of examples so far.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether no example has been added.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Adds one example; `Err` says what is wrong with it (the caller names file and user).
    pub fn push(&mut self, x: &RawInput, y: &RawLabel) -> Result<(), String> {
        let label = match (x, y) {
            (RawInput::Numbers(n), _) => {
                if self.tokens {
                    return Err("a feature vector where earlier examples are text".into());
                }
                let label = class(y)?;
                let start = self.dense.len();
                let shape = match n.flatten(&mut self.dense) {
                    Ok(s) if s.is_empty() => vec![1],
                    Ok(s) => s,
                    Err(e) => {
                        self.dense.truncate(start);
                        return Err(e);
                    }
                };
                match &self.shape {
                    Some(first) if *first != shape => {
                        self.dense.truncate(start);
                        return Err(format!(
                            "an input of shape {shape:?} where earlier examples have {first:?}"
                        ));
                    }
                    Some(_) => {}
                    None => self.shape = Some(shape),
                }
                label
            }
            (RawInput::Text(s), RawLabel::Text(c)) => {
                if !self.is_empty() && !self.tokens {
                    return Err("text where earlier examples are feature vectors".into());
                }
                let ids = token_ids(s)?;
                match &self.shape {
                    Some(first) if first[..] != [ids.len()] => {
                        return Err(format!(
                            "a sequence of {} characters where earlier ones have {}",
                            ids.len(),
                            first[0]
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.shape = Some(vec![ids.len()]);
                        self.tokens = true;
                    }
                }
                let next = token_ids(c)?;
                let [id] = next[..] else {
                    return Err(format!("the label `{c}` is not one character"));
                };
                self.text.extend(ids);
                u32::from(id)
            }
            (RawInput::Text(_), _) => {
                return Err("a text input needs a one-character label".into());
            }
        };
        self.labels.push(label);
        Ok(())
    }

    /// The classes the labels so far imply: one more than the largest, LEAF's vocabulary
    /// for text.
    pub fn classes_found(&self) -> usize {
        if self.tokens {
            VOCAB.len()
        } else {
            self.labels.iter().max().map_or(0, |&m| m as usize + 1)
        }
    }

    /// The examples as a dataset of `classes` classes (by default
    /// [`classes_found`](Self::classes_found)), reshaped to `shape` where given. `source`
    /// names the data in errors.
    pub fn finish(
        self,
        source: &Path,
        shape: Option<&[usize]>,
        classes: Option<usize>,
    ) -> Result<Dataset, DataError> {
        let corrupt = |reason: String| DataError::Corrupt {
            path: source.to_path_buf(),
            reason,
        };
        let found = self.classes_found();
        let classes = match classes {
            Some(c) if c < found => {
                return Err(corrupt(format!(
                    "a label is {}, beyond the {c} classes `dataset.classes` names",
                    found - 1
                )));
            }
            Some(c) => c,
            None => found,
        };
        let row = self.shape.clone().unwrap_or_default();
        let inputs = if self.tokens {
            if shape.is_some() {
                return Err(corrupt(
                    "`dataset.shape` reshapes feature vectors; these examples are text".into(),
                ));
            }
            Inputs::Tokens {
                len: row.first().copied().unwrap_or(0),
                values: self.text,
            }
        } else {
            let shape = match shape {
                Some(s) if s.iter().product::<usize>() != row.iter().product::<usize>() => {
                    return Err(corrupt(format!(
                        "examples of shape {row:?} do not fit `dataset.shape` {s:?}"
                    )));
                }
                Some(s) => s.to_vec(),
                None => row,
            };
            Inputs::Dense {
                shape,
                values: self.dense,
            }
        };
        Ok(Dataset {
            inputs,
            labels: self.labels,
            classes,
        })
    }
}

/// A class index from a JSON label.
fn class(y: &RawLabel) -> Result<u32, String> {
    match *y {
        RawLabel::Class(c) => u32::try_from(c).map_err(|_| format!("the label {c} is too large")),
        RawLabel::Float(f) if f.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&f) => {
            Ok(f as u32)
        }
        RawLabel::Float(f) => Err(format!("the label {f} is not a class index")),
        RawLabel::Text(ref s) => Err(format!(
            "the label `{s}` is text but the input is a feature vector"
        )),
    }
}

/// Ids of a text's characters in LEAF's vocabulary.
fn token_ids(s: &str) -> Result<Vec<u8>, String> {
    s.chars()
        .map(|c| {
            VOCAB
                .find(c)
                .map(|i| i as u8)
                .ok_or_else(|| format!("the character {c:?} is not in LEAF's vocabulary"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(v: &[f32]) -> RawInput {
        RawInput::Numbers(NestedNumbers::Array(
            v.iter().map(|&x| NestedNumbers::Scalar(x)).collect(),
        ))
    }

    #[test]
    fn nested_rows_flatten_and_keep_their_shape() {
        let x: RawInput = serde_json::from_str("[[1, 2], [3, 4], [5, 6]]").unwrap();
        let mut b = DatasetBuilder::default();
        b.push(&x, &RawLabel::Class(2)).unwrap();
        b.push(&x, &RawLabel::Float(0.0)).unwrap();
        let d = b.finish(Path::new("f"), None, None).unwrap();
        assert_eq!(d.classes, 3);
        assert_eq!(d.labels, [2, 0]);
        let Inputs::Dense { shape, values } = d.inputs else {
            panic!("dense")
        };
        assert_eq!(shape, [3, 2]);
        assert_eq!(values[..6], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn ragged_and_mixed_examples_are_refused() {
        let mut b = DatasetBuilder::default();
        b.push(&num(&[1.0, 2.0]), &RawLabel::Class(0)).unwrap();
        assert!(b.push(&num(&[1.0]), &RawLabel::Class(0)).is_err());
        assert!(b.push(&num(&[1.0, 2.0]), &RawLabel::Float(0.5)).is_err());
        let text = RawInput::Text("ab".into());
        assert!(b.push(&text, &RawLabel::Text("c".into())).is_err());
        let ragged: RawInput = serde_json::from_str("[[1, 2], [3]]").unwrap();
        assert!(b.push(&ragged, &RawLabel::Class(0)).is_err());
        // What was refused left no values behind.
        b.push(&num(&[3.0, 4.0]), &RawLabel::Class(1)).unwrap();
        let d = b.finish(Path::new("f"), Some(&[1, 2, 1]), None).unwrap();
        let Inputs::Dense { shape, values } = d.inputs else {
            panic!("dense")
        };
        assert_eq!((shape, values), (vec![1, 2, 1], vec![1.0, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn text_maps_to_leafs_vocabulary() {
        let mut b = DatasetBuilder::default();
        b.push(&RawInput::Text("ab ".into()), &RawLabel::Text("c".into()))
            .unwrap();
        assert!(
            b.push(&RawInput::Text("a~b".into()), &RawLabel::Text("c".into()))
                .is_err()
        );
        assert!(
            b.push(&RawInput::Text("abc".into()), &RawLabel::Text("cd".into()))
                .is_err()
        );
        let d = b.finish(Path::new("f"), None, None).unwrap();
        assert_eq!(d.classes, VOCAB.len());
        assert_eq!(d.labels, [VOCAB.find('c').unwrap() as u32]);
        let Inputs::Tokens { len, values } = d.inputs else {
            panic!("tokens")
        };
        assert_eq!(len, 3);
        let id = |c| VOCAB.find(c).unwrap() as u8;
        assert_eq!(values, [id('a'), id('b'), id(' ')]);
    }

    #[test]
    fn classes_and_shape_are_checked_against_the_data() {
        let mut b = DatasetBuilder::default();
        b.push(&num(&[1.0, 2.0]), &RawLabel::Class(4)).unwrap();
        let e = b.finish(Path::new("f"), None, Some(3)).unwrap_err();
        assert!(e.to_string().contains("beyond the 3 classes"), "{e}");
        let mut b = DatasetBuilder::default();
        b.push(&num(&[1.0, 2.0]), &RawLabel::Class(0)).unwrap();
        let e = b.finish(Path::new("f"), Some(&[3]), None).unwrap_err();
        assert!(e.to_string().contains("do not fit"), "{e}");
    }
}
