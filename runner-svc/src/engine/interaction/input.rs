//! User-input values: the JSON Schema and kind checks shared by tree validation (a node's
//! `default`) and decision validation (a person's answer).

use serde_json::Value as Json;

use crate::engine::spec::InputKind;

/// Compiles a JSON Schema (draft detected from `$schema`, latest otherwise).
pub(crate) fn compile_schema(schema: &Json) -> Result<jsonschema::Validator, String> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err("must be a JSON Schema (an object or a boolean)".to_string());
    }
    jsonschema::validator_for(schema).map_err(|e| format!("invalid JSON Schema: {e}"))
}

pub(crate) fn parse_kind(s: &str) -> Option<InputKind> {
    Some(match s {
        "text" => InputKind::Text,
        "select" => InputKind::Select,
        "number" => InputKind::Number,
        "json" => InputKind::Json,
        _ => return None,
    })
}

/// Checks an input value against its kind, options and schema.
pub(crate) fn check_value(
    kind: InputKind,
    options: &[Json],
    schema: Option<&Json>,
    value: &Json,
) -> Result<(), String> {
    match kind {
        InputKind::Text if !value.is_string() => return Err("must be a string".into()),
        InputKind::Number if !value.is_number() => return Err("must be a number".into()),
        InputKind::Select if !options.contains(value) => {
            return Err(format!(
                "must be one of the options {}",
                Json::Array(options.to_vec())
            ));
        }
        _ => {}
    }
    if let Some(schema) = schema {
        let validator = compile_schema(schema)?;
        if let Some(error) = validator.iter_errors(value).next() {
            let at = error.instance_path().to_string();
            return Err(if at.is_empty() {
                format!("does not match the schema: {error}")
            } else {
                format!("does not match the schema at {at}: {error}")
            });
        }
    }
    Ok(())
}
