//! Validation of a tree document into a `TreeSpec`. It never stops at the first problem: every
//! violation is collected with its JSON path, and a spec exists only when there are none.

use std::collections::HashMap;

use arbor_shared::status::FieldViolation;
use serde_json::{Map, Value as Json};

use super::fields::Fields;
use super::kinds::{COMPOSITES, DECORATORS, read_kind};
use super::{MAX_DEPTH, MAX_NODES, NodeKind, NodeSpec, TreeSpec};

pub(super) fn parse_document(doc: Json) -> Result<TreeSpec, Vec<FieldViolation>> {
    let mut out = Vec::new();
    let Some(map) = doc.as_object() else {
        return Err(vec![FieldViolation::new("$", "must be an object")]);
    };
    let mut f = Fields {
        map,
        path: "$",
        out: &mut out,
    };
    f.deny_unknown(&["id", "version", "root", "task_types"]);
    let id = f.string("id");
    if let Some(id) = &id
        && !valid_id(id)
    {
        f.violation("id", "must be 1 to 128 characters of [A-Za-z0-9_.-]");
    }
    let version = f.uint("version", 1, u64::from(u32::MAX));
    let root = f.any("root");
    let task_types = f.opt_string_list("task_types");
    for (i, name) in task_types.iter().enumerate() {
        if name.len() > 128 || name.chars().any(|c| c.is_control() || c == '*' || c == '?') {
            f.violation(
                &format!("task_types[{i}]"),
                "must be a task type name of at most 128 characters, without globs",
            );
        }
    }
    let mut parser = Parser {
        out,
        nodes: Vec::new(),
        locators: HashMap::new(),
        too_many: false,
    };
    if let Some(root) = &root {
        parser.node(root, "$.root", "", 1);
    }
    match (id, version) {
        (Some(id), Some(version)) if parser.out.is_empty() => Ok(TreeSpec {
            id,
            version: u32::try_from(version).unwrap_or(u32::MAX),
            nodes: parser.nodes,
            document: canonical(doc),
            task_types,
        }),
        _ => Err(parser.out),
    }
}

fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Sorts object keys at every level, so equal documents print identically whatever the input
/// order or the `serde_json` map implementation.
fn canonical(value: Json) -> Json {
    match value {
        Json::Object(map) => {
            let mut entries: Vec<(String, Json)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, canonical(v)))
                    .collect::<Map<_, _>>(),
            )
        }
        Json::Array(items) => Json::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

struct Parser {
    out: Vec<FieldViolation>,
    nodes: Vec<NodeSpec>,
    /// locator → JSON path of the node that has it
    locators: HashMap<String, String>,
    too_many: bool,
}

impl Parser {
    fn violation(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.out.push(FieldViolation::new(field, description));
    }

    /// Validates one node and its subtree, appending them in pre-order. Returns its index.
    fn node(&mut self, value: &Json, jpath: &str, tpath: &str, depth: usize) -> Option<usize> {
        if depth > MAX_DEPTH {
            self.violation(jpath, format!("nesting deeper than {MAX_DEPTH} nodes"));
            return None;
        }
        if self.nodes.len() >= MAX_NODES {
            if !self.too_many {
                self.too_many = true;
                self.violation("$.root", format!("more than {MAX_NODES} nodes"));
            }
            return None;
        }
        let Some(map) = value.as_object() else {
            self.violation(jpath, "must be an object (a node)");
            return None;
        };
        let index = self.nodes.len();
        let mut out = std::mem::take(&mut self.out);
        let mut f = Fields {
            map,
            path: jpath,
            out: &mut out,
        };
        let ty = f.string("type").unwrap_or_default();
        let name = f.opt_string("name");
        if let Some(name) = &name
            && (name.len() > 128 || name.contains('/'))
        {
            f.violation("name", "must be at most 128 characters without '/'");
        }
        let locator = match (&name, tpath) {
            (Some(name), _) => name.clone(),
            (None, "") => "root".to_string(),
            (None, path) => path.to_string(),
        };
        if let Some(previous) = self.locators.get(&locator) {
            let field = if name.is_some() { "name" } else { "type" };
            f.violation(
                field,
                format!("duplicate node name '{locator}' (also at {previous})"),
            );
        } else {
            self.locators.insert(locator.clone(), jpath.to_string());
        }
        let kind = read_kind(&ty, &mut f);
        self.out = out;
        self.nodes.push(NodeSpec {
            name,
            locator,
            children: Vec::new(),
            end: index + 1,
            kind: kind.clone().unwrap_or(NodeKind::Succeed),
        });

        let mut children = Vec::new();
        if COMPOSITES.contains(&ty.as_str()) {
            match map.get("children") {
                None => self.violation(format!("{jpath}.children"), "is required"),
                Some(Json::Array(items)) if items.is_empty() => {
                    self.violation(format!("{jpath}.children"), "must not be empty")
                }
                Some(Json::Array(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        let child_t = child_path(tpath, i);
                        let child_j = format!("{jpath}.children[{i}]");
                        if let Some(c) = self.node(item, &child_j, &child_t, depth + 1) {
                            children.push(c);
                        }
                    }
                }
                Some(_) => self.violation(format!("{jpath}.children"), "must be an array"),
            }
            let declared = map
                .get("children")
                .and_then(Json::as_array)
                .map_or(0, Vec::len);
            if let Some(NodeKind::Parallel { success_threshold }) = kind
                && declared > 0
                && success_threshold > declared
            {
                self.violation(
                    format!("{jpath}.success_threshold"),
                    format!("must be from 1 to the number of children ({declared})"),
                );
            }
        } else if DECORATORS.contains(&ty.as_str()) {
            match map.get("child") {
                None => self.violation(format!("{jpath}.child"), "is required"),
                Some(child) => {
                    let child_j = format!("{jpath}.child");
                    if let Some(c) = self.node(child, &child_j, &child_path(tpath, 0), depth + 1) {
                        children.push(c);
                    }
                }
            }
        }
        let end = self.nodes.len();
        if let Some(node) = self.nodes.get_mut(index) {
            if let NodeKind::Parallel { success_threshold } = &mut node.kind
                && *success_threshold == 0
            {
                *success_threshold = children.len();
            }
            node.children = children;
            node.end = end;
        }
        Some(index)
    }
}

fn child_path(parent: &str, i: usize) -> String {
    if parent.is_empty() {
        i.to_string()
    } else {
        format!("{parent}/{i}")
    }
}
