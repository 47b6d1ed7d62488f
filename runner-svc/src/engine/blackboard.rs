//! Dotted-path access to the blackboard and `{"$ref": "a.b"}` resolution inside values.

use serde_json::{Map, Value as Json};

/// The value at a dotted path; array elements are addressed by index (`items.0`).
pub(crate) fn get<'a>(board: &'a Map<String, Json>, path: &str) -> Option<&'a Json> {
    let mut parts = path.split('.');
    let mut current = board.get(parts.next()?)?;
    for part in parts {
        current = match current {
            Json::Object(map) => map.get(part)?,
            Json::Array(items) => items.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// Writes at a dotted path, creating intermediate objects.
pub(crate) fn set(board: &mut Map<String, Json>, path: &str, value: Json) -> Result<(), String> {
    if !path.contains('.') {
        // One search of the map: the common case is a plain top-level key.
        board.insert(path.to_string(), value);
        return Ok(());
    }
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else {
        return Err("empty blackboard key".into());
    };
    let mut map = board;
    for (depth, part) in parts.iter().enumerate() {
        let slot = map
            .entry(part.to_string())
            .or_insert_with(|| Json::Object(Map::new()));
        map = match slot {
            Json::Object(inner) => inner,
            _ => {
                return Err(format!(
                    "cannot set '{path}': '{}' is not an object",
                    parts[..=depth].join(".")
                ));
            }
        };
    }
    map.insert(last.to_string(), value);
    Ok(())
}

/// Whether `resolve` would change anything.
pub(crate) fn has_refs(value: &Json) -> bool {
    match value {
        Json::Object(map) => map.contains_key("$ref") || map.values().any(has_refs),
        Json::Array(items) => items.iter().any(has_refs),
        _ => false,
    }
}

/// Replaces every `{"$ref": "path"}` with the blackboard value at that path.
pub(crate) fn resolve(board: &Map<String, Json>, value: &Json) -> Result<Json, String> {
    match value {
        Json::Object(map) => {
            if map.len() == 1
                && let Some(Json::String(path)) = map.get("$ref")
            {
                return get(board, path)
                    .cloned()
                    .ok_or_else(|| format!("blackboard has no '{path}'"));
            }
            let mut out = Map::with_capacity(map.len());
            for (k, v) in map {
                out.insert(k.clone(), resolve(board, v)?);
            }
            Ok(Json::Object(out))
        }
        Json::Array(items) => items
            .iter()
            .map(|v| resolve(board, v))
            .collect::<Result<Vec<_>, _>>()
            .map(Json::Array),
        other => Ok(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn board(v: Json) -> Map<String, Json> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn dotted_get_reads_objects_and_arrays() {
        let b = board(json!({"a": {"b": [1, {"c": 2}]}}));
        assert_eq!(get(&b, "a.b.1.c"), Some(&json!(2)));
        assert_eq!(get(&b, "a.x"), None);
        assert_eq!(get(&b, "a.b.9"), None);
    }

    #[test]
    fn set_creates_intermediate_objects_and_refuses_scalars() {
        let mut b = board(json!({"n": 1}));
        set(&mut b, "x.y.z", json!(true)).unwrap();
        assert_eq!(get(&b, "x.y.z"), Some(&json!(true)));
        let err = set(&mut b, "n.m", json!(1)).unwrap_err();
        assert!(err.contains("'n' is not an object"), "{err}");
    }

    #[test]
    fn refs_resolve_anywhere_and_missing_refs_are_errors() {
        let b = board(json!({"plan": {"service": "billing"}}));
        let v = json!({"x": [{"$ref": "plan.service"}], "y": {"$ref": "plan"}});
        assert_eq!(
            resolve(&b, &v).unwrap(),
            json!({"x": ["billing"], "y": {"service": "billing"}})
        );
        let err = resolve(&b, &json!({"$ref": "nope"})).unwrap_err();
        assert_eq!(err, "blackboard has no 'nope'");
    }
}
