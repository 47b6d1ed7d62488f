//! Forms generated from a JSON Schema (a tool's arguments, a question's answer): one field per
//! property, the value a person typed turned back into JSON, and the schema's verdict on it
//! with each error placed next to the field it is about.

use serde_json::{Map, Value as Json, json};

use super::session::Fields;

/// One field of a generated form.
pub struct Field {
    pub key: String,
    pub label: String,
    pub value: String,
    pub hint: String,
    pub error: String,
    pub required: bool,
    pub multiline: bool,
}

/// What a value of `schema` is: its `type`, or the type of `example` when it names none.
fn type_of(schema: &Json, example: Option<&Json>) -> String {
    match schema.get("type") {
        Some(Json::String(t)) => t.clone(),
        _ => match example {
            Some(Json::String(_)) => "string".into(),
            Some(Json::Number(n)) if n.is_i64() || n.is_u64() => "integer".into(),
            Some(Json::Number(_)) => "number".into(),
            Some(Json::Bool(_)) => "boolean".into(),
            Some(Json::Null) | None => "string".into(),
            Some(_) => "json".into(),
        },
    }
}

/// A schema for `args` when the request carries none: every property typed as its value is.
pub fn inferred(args: &Json) -> Json {
    let props: Map<String, Json> = args
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let t = type_of(&Json::Null, Some(v));
                    let s = match t.as_str() {
                        "json" => json!({}),
                        t => json!({"type": t}),
                    };
                    (k.clone(), s)
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"type": "object", "properties": props})
}

fn text_of(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        Json::Null => String::new(),
        other => other.to_string(),
    }
}

fn field(key: &str, label: &str, schema: &Json, value: Option<&Json>, required: bool) -> Field {
    let t = type_of(schema, value);
    let hint = match schema.get("description").and_then(Json::as_str) {
        Some(d) => format!("{t}: {d}"),
        None => match t.as_str() {
            "string" => "text".into(),
            "json" | "object" | "array" => "JSON".into(),
            other => other.to_string(),
        },
    };
    Field {
        key: key.to_string(),
        label: label.to_string(),
        multiline: matches!(t.as_str(), "json" | "object" | "array")
            || value.is_some_and(|v| text_of(v).len() > 60),
        value: value.map(text_of).unwrap_or_default(),
        hint,
        error: String::new(),
        required,
    }
}

/// The fields of an object form for `schema`, filled with `current`.
pub fn object_fields(schema: &Json, current: &Json) -> Vec<Field> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let mut keys: Vec<String> = schema
        .get("properties")
        .and_then(Json::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(m) = current.as_object() {
        for k in m.keys() {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    keys.iter()
        .map(|k| {
            let s = schema
                .get("properties")
                .and_then(|p| p.get(k))
                .cloned()
                .unwrap_or(Json::Null);
            field(k, k, &s, current.get(k), required.contains(&k.as_str()))
        })
        .collect()
}

/// A single-value form (a question's answer) for `schema`, filled with `current`.
pub fn value_field(label: &str, schema: &Json, input_kind: &str, current: Option<&Json>) -> Field {
    let schema = match (schema.get("type"), input_kind) {
        (Some(_), _) => schema.clone(),
        (None, "number") => json!({"type": "number"}),
        (None, "json") => json!({}),
        (None, _) => json!({"type": "string"}),
    };
    let mut f = field("value", label, &schema, current, true);
    f.multiline = input_kind == "text" || f.multiline;
    f
}

/// What a person typed for a field of type `t` as JSON; an error says what is wrong.
fn parse(t: &str, text: &str) -> Result<Json, String> {
    match t {
        "string" => Ok(Json::String(text.to_string())),
        "integer" => text
            .trim()
            .parse::<i64>()
            .map(Json::from)
            .map_err(|_| "must be a whole number".into()),
        "number" => text
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|n| serde_json::Number::from_f64(n).map(Json::Number))
            .ok_or_else(|| "must be a number".into()),
        "boolean" => match text.trim() {
            "true" => Ok(Json::Bool(true)),
            "false" => Ok(Json::Bool(false)),
            _ => Err("must be true or false".into()),
        },
        _ => serde_json::from_str(text).map_err(|e| format!("must be JSON: {e}")),
    }
}

/// The object the fields of `fields` (named `arg.KEY`) hold, checked against `schema`; on
/// an error, the fields with each error next to its own.
pub fn read_object(schema: &Json, original: &Json, form: &Fields) -> Result<Json, Vec<Field>> {
    let mut fields = object_fields(schema, original);
    let mut out = Map::new();
    let mut bad = false;
    for f in &mut fields {
        let text = form.text(&format!("arg.{}", f.key));
        f.value = text.clone();
        if text.is_empty() && !f.required {
            continue;
        }
        let s = schema
            .get("properties")
            .and_then(|p| p.get(&f.key))
            .cloned()
            .unwrap_or(Json::Null);
        match parse(&type_of(&s, original.get(&f.key)), &text) {
            Ok(v) => {
                out.insert(f.key.clone(), v);
            }
            Err(e) => {
                f.error = e;
                bad = true;
            }
        }
    }
    let value = Json::Object(out);
    if !bad {
        bad = place_errors(schema, &value, &mut fields);
    }
    match bad {
        true => Err(fields),
        false => Ok(value),
    }
}

/// A question's answer (field `arg.value`), checked against `schema`.
pub fn read_value(schema: &Json, input_kind: &str, form: &Fields) -> Result<Json, Vec<Field>> {
    let mut f = value_field("Answer", schema, input_kind, None);
    let text = form.text("arg.value");
    f.value = text.clone();
    let t = match input_kind {
        "number" => "number".to_string(),
        "json" | "select" => "json".to_string(),
        _ => type_of(schema, None),
    };
    let parsed = match (input_kind, parse(&t, &text)) {
        // A select's option may be typed bare when it is a string.
        ("select", Err(_)) => Ok(Json::String(text.clone())),
        (_, r) => r,
    };
    let mut fields = vec![f];
    match parsed {
        Err(e) => {
            fields[0].error = e;
            Err(fields)
        }
        Ok(v) => match place_errors(schema, &v, &mut fields) {
            true => Err(fields),
            false => Ok(v),
        },
    }
}

/// Checks `value` against `schema` and writes each error to the field its path starts at
/// (the first field when it names none). Whether there was any.
fn place_errors(schema: &Json, value: &Json, fields: &mut [Field]) -> bool {
    let Ok(validator) = jsonschema::validator_for(schema) else {
        // A schema that does not compile constrains nothing here; the service that owns it
        // checks again.
        return false;
    };
    let mut any = false;
    for e in validator.iter_errors(value) {
        any = true;
        let path = e.instance_path().to_string();
        let key = path.trim_start_matches('/').split('/').next().unwrap_or("");
        let i = fields.iter().position(|f| f.key == key).unwrap_or(0);
        if let Some(f) = fields.get_mut(i) {
            if !f.error.is_empty() {
                f.error.push_str("; ");
            }
            f.error.push_str(&e.to_string());
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Fields {
        Fields(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn an_object_is_read_by_the_types_of_its_schema_and_each_error_sits_at_its_field() {
        let schema = json!({"type": "object", "required": ["amount"], "properties": {
            "amount": {"type": "integer", "minimum": 1},
            "payee": {"type": "string", "minLength": 3},
            "tags": {"type": "array"}
        }});
        let original = json!({"amount": 5, "payee": "acme", "tags": ["a"]});
        let ok = read_object(
            &schema,
            &original,
            &form(&[
                ("arg.amount", "7"),
                ("arg.payee", "bolt"),
                ("arg.tags", "[\"x\"]"),
            ]),
        )
        .unwrap_or_else(|_| panic!("a valid form"));
        assert_eq!(ok, json!({"amount": 7, "payee": "bolt", "tags": ["x"]}));

        let Err(fields) = read_object(
            &schema,
            &original,
            &form(&[("arg.amount", "lots"), ("arg.payee", "bolt")]),
        ) else {
            panic!("not a number is refused")
        };
        let amount = fields.iter().find(|f| f.key == "amount").map(|f| &f.error);
        assert_eq!(amount.map(String::as_str), Some("must be a whole number"));
        assert_eq!(
            fields
                .iter()
                .find(|f| f.key == "amount")
                .map(|f| f.value.as_str()),
            Some("lots")
        );

        let Err(fields) = read_object(
            &schema,
            &original,
            &form(&[("arg.amount", "0"), ("arg.payee", "ab")]),
        ) else {
            panic!("the schema's limits are checked")
        };
        for key in ["amount", "payee"] {
            let f = fields.iter().find(|f| f.key == key);
            assert!(
                f.is_some_and(|f| !f.error.is_empty()),
                "{key} has its error"
            );
        }
        assert!(
            fields
                .iter()
                .find(|f| f.key == "tags")
                .is_some_and(|f| f.error.is_empty())
        );
    }

    #[test]
    fn a_schema_is_inferred_from_the_arguments_when_none_is_given() {
        let args = json!({"n": 3, "x": 1.5, "s": "a", "b": true, "o": {"k": 1}});
        let schema = inferred(&args);
        assert_eq!(schema["properties"]["n"], json!({"type": "integer"}));
        assert_eq!(schema["properties"]["x"], json!({"type": "number"}));
        assert_eq!(schema["properties"]["o"], json!({}));
        let Err(fields) = read_object(&schema, &args, &form(&[("arg.n", "three")])) else {
            panic!("an integer stays an integer")
        };
        assert!(fields.iter().any(|f| f.key == "n" && !f.error.is_empty()));
    }

    #[test]
    fn an_answer_is_checked_against_the_question_schema() {
        let schema = json!({"type": "string", "minLength": 5});
        assert_eq!(
            read_value(&schema, "text", &form(&[("arg.value", "hello world")])).ok(),
            Some(json!("hello world"))
        );
        let Err(fields) = read_value(&schema, "text", &form(&[("arg.value", "tiny")])) else {
            panic!("too short")
        };
        assert!(!fields[0].error.is_empty());
        assert_eq!(
            read_value(&json!({}), "number", &form(&[("arg.value", "2.5")])).ok(),
            Some(json!(2.5))
        );
    }
}
