//! Plain leaves: condition, set, wait, fail, log (succeed needs no code).

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::Value as Json;

use super::Ctx;
use crate::engine::checkpoint::NodeData;
use crate::engine::spec::{CondOp, ConditionSpec};
use crate::engine::{Effect, TickStatus, blackboard};

pub(super) fn condition(cx: &mut Ctx<'_>, idx: usize, c: &ConditionSpec) -> TickStatus {
    let expected = if blackboard::has_refs(&c.value) {
        match cx.resolve(&c.value) {
            Ok(v) => Cow::Owned(v),
            Err(e) => {
                let loc = cx.locator(idx);
                return cx.fail(format!("condition '{loc}': {e}"));
            }
        }
    } else {
        Cow::Borrowed(&c.value)
    };
    let actual = blackboard::get(cx.board(), &c.key);
    let holds = match c.op {
        CondOp::Exists => actual.is_some(),
        CondOp::NotExists => actual.is_none(),
        CondOp::Truthy => actual.is_some_and(truthy),
        CondOp::Eq => equal(actual.unwrap_or(&Json::Null), &expected),
        CondOp::Ne => !equal(actual.unwrap_or(&Json::Null), &expected),
        CondOp::Gt => compare(actual, &expected) == Some(Ordering::Greater),
        CondOp::Ge => matches!(
            compare(actual, &expected),
            Some(Ordering::Greater | Ordering::Equal)
        ),
        CondOp::Lt => compare(actual, &expected) == Some(Ordering::Less),
        CondOp::Le => matches!(
            compare(actual, &expected),
            Some(Ordering::Less | Ordering::Equal)
        ),
    };
    if holds {
        TickStatus::Success
    } else {
        cx.fail_quietly(idx)
    }
}

fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// JSON equality where 1 and 1.0 are equal.
fn equal(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// Numbers compare with numbers and strings with strings; anything else is not ordered.
fn compare(a: Option<&Json>, b: &Json) -> Option<Ordering> {
    match (a?, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Json::String(x), Json::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

pub(super) fn set(cx: &mut Ctx<'_>, idx: usize, key: &str, value: &Json) -> TickStatus {
    let written = cx.resolve(value).and_then(|v| cx.write(key, v));
    match written {
        Ok(()) => TickStatus::Success,
        Err(e) => {
            let loc = cx.locator(idx);
            cx.fail(format!("set '{loc}': {e}"))
        }
    }
}

/// A durable timer: the absolute deadline is stored on first entry and reported as the wake time.
pub(super) fn wait(cx: &mut Ctx<'_>, idx: usize, ms: u64) -> TickStatus {
    let now = cx.env.now_ms;
    let deadline = match &mut cx.ck.nodes[idx].data {
        NodeData::Leaf { deadline } => *deadline.get_or_insert(now.saturating_add(ms)),
        _ => now.saturating_add(ms),
    };
    if now >= deadline {
        return TickStatus::Success;
    }
    cx.wake_at(deadline);
    TickStatus::Running
}

pub(super) fn fail(cx: &mut Ctx<'_>, idx: usize, message: &str) -> TickStatus {
    if message.is_empty() {
        let loc = cx.locator(idx);
        cx.fail(format!("fail '{loc}'"))
    } else {
        cx.fail(message)
    }
}

pub(super) fn log(cx: &mut Ctx<'_>, idx: usize, message: &str) -> TickStatus {
    cx.effects.push(Effect::Log {
        node_locator: cx.locator(idx).to_string(),
        message: message.to_string(),
    });
    TickStatus::Success
}
