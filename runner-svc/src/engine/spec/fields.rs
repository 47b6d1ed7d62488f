//! Typed reads of one JSON object's fields that record a violation (with its JSON path) instead of
//! stopping, so validation can report every problem of a document at once.

use arbor_shared::status::FieldViolation;
use serde_json::{Map, Value as Json};

pub(super) struct Fields<'a> {
    pub map: &'a Map<String, Json>,
    pub path: &'a str,
    pub out: &'a mut Vec<FieldViolation>,
}

impl<'a> Fields<'a> {
    pub fn at(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    pub fn violation(&mut self, key: &str, description: impl Into<String>) {
        let field = self.at(key);
        self.out.push(FieldViolation::new(field, description));
    }

    pub fn deny_unknown(&mut self, allowed: &[&str]) {
        let unknown: Vec<String> = self
            .map
            .keys()
            .filter(|k| !allowed.contains(&k.as_str()))
            .cloned()
            .collect();
        for key in unknown {
            self.violation(&key, "unknown field");
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<&'a Json> {
        self.map.get(key)
    }

    /// A required, non-empty string.
    pub fn string(&mut self, key: &str) -> Option<String> {
        if !self.has(key) {
            self.violation(key, "is required");
            return None;
        }
        self.opt_string(key)
    }

    /// An optional string; present means non-empty.
    pub fn opt_string(&mut self, key: &str) -> Option<String> {
        match self.map.get(key) {
            None => None,
            Some(Json::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Json::String(_)) => {
                self.violation(key, "must not be empty");
                None
            }
            Some(_) => {
                self.violation(key, "must be a string");
                None
            }
        }
    }

    /// A required integer no smaller than `min`.
    pub fn uint(&mut self, key: &str, min: u64, max: u64) -> Option<u64> {
        if !self.has(key) {
            self.violation(key, "is required");
            return None;
        }
        self.opt_uint(key, min, max)
    }

    pub fn opt_uint(&mut self, key: &str, min: u64, max: u64) -> Option<u64> {
        let value = self.map.get(key)?;
        match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.violation(key, format!("must be an integer from {min} to {max}"));
                None
            }
        }
    }

    /// An optional string restricted to a set of words; a violation names the accepted ones.
    pub fn opt_word<T>(&mut self, key: &str, words: &[(&str, T)]) -> Option<T>
    where
        T: Copy,
    {
        let value = self.map.get(key)?;
        let parsed = value
            .as_str()
            .and_then(|s| words.iter().find(|(w, _)| *w == s).map(|(_, t)| *t));
        if parsed.is_none() {
            let names: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
            self.violation(key, unknown_word(value, &names));
        }
        parsed
    }

    /// An optional boolean.
    pub fn opt_bool(&mut self, key: &str) -> Option<bool> {
        let value = self.map.get(key)?;
        let parsed = value.as_bool();
        if parsed.is_none() {
            self.violation(key, "must be true or false");
        }
        parsed
    }

    /// A required piece of JSON of any shape.
    pub fn any(&mut self, key: &str) -> Option<Json> {
        let value = self.map.get(key).cloned();
        if value.is_none() {
            self.violation(key, "is required");
        }
        value
    }

    pub fn opt_string_list(&mut self, key: &str) -> Vec<String> {
        let Some(value) = self.map.get(key) else {
            return Vec::new();
        };
        let Some(items) = value.as_array() else {
            self.violation(key, "must be an array of strings");
            return Vec::new();
        };
        let mut list = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item.as_str() {
                Some(s) if !s.is_empty() => list.push(s.to_string()),
                _ => self.violation(&format!("{key}[{i}]"), "must be a non-empty string"),
            }
        }
        list
    }
}

/// `unknown value "zzz"; expected one of: a, b, c`.
pub(super) fn unknown_word(value: &Json, words: &[&str]) -> String {
    format!(
        "unknown value {value}; expected one of: {}",
        words.join(", ")
    )
}
