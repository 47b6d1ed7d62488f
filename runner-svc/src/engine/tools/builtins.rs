//! Side-effect-free built-in tools.

use serde_json::{Number, Value as Json};

use super::{Tool, ToolCall, ToolError};

/// Returns its arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        Ok(call.args.clone())
    }
}

/// Adds numbers: `{"a": x, "b": y}` or `{"values": [x, …]}`. Integers stay integers while they fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct MathAdd;

impl Tool for MathAdd {
    fn name(&self) -> &str {
        "math.add"
    }

    fn call(&self, call: &ToolCall) -> Result<Json, ToolError> {
        let args = &call.args;
        let values: Vec<&Json> = match (args.get("values"), args.get("a"), args.get("b")) {
            (Some(Json::Array(items)), None, None) => items.iter().collect(),
            (None, Some(a), Some(b)) => vec![a, b],
            _ => {
                return Err(ToolError::InvalidArgs(
                    "expected {\"a\": number, \"b\": number} or {\"values\": [number, …]}".into(),
                ));
            }
        };
        let mut int_sum: Option<i64> = Some(0);
        let mut float_sum = 0.0;
        for (i, v) in values.iter().enumerate() {
            let Json::Number(n) = v else {
                return Err(ToolError::InvalidArgs(format!(
                    "operand {i} is not a number"
                )));
            };
            int_sum = int_sum.zip(n.as_i64()).and_then(|(s, x)| s.checked_add(x));
            float_sum += n.as_f64().unwrap_or(0.0);
        }
        match int_sum {
            Some(s) => Ok(Json::Number(s.into())),
            None => Number::from_f64(float_sum)
                .map(Json::Number)
                .ok_or_else(|| ToolError::Failed("sum is not a finite number".into())),
        }
    }
}
