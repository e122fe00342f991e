//! The string table of pprof and of OTLP's dictionary.

use std::collections::HashMap;

/// A string table (pprof's, OTLP's dictionary's): index 0 is the empty string.
pub struct Strings {
    /// The strings by index, as the message's string table holds them.
    pub table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Strings {
        Strings::new()
    }
}

impl Strings {
    /// A table that holds only the empty string, at index 0.
    pub fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            ids: HashMap::from([(String::new(), 0)]),
        }
    }
    /// The index of `s`, added at the end the first time.
    pub fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.ids.insert(s.to_owned(), i);
        i
    }
}
