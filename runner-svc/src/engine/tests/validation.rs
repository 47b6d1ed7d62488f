//! Tree validation: every error at once, each with its JSON path; canonical JSON.

use arbor_shared::status::FieldViolation;
use serde_json::{Value as Json, json};

use crate::engine::{TreeFormat, parse_tree};

fn errors(doc: Json) -> Vec<FieldViolation> {
    parse_tree(&doc.to_string(), TreeFormat::Json).unwrap_err()
}

fn fields(doc: Json) -> Vec<String> {
    errors(doc).into_iter().map(|v| v.field).collect()
}

#[test]
fn every_error_is_reported_with_its_path() {
    let doc = json!({"id": "bad id!", "version": 0, "extra": 1, "root": {
    "type": "sequence", "name": "dup", "children": [
        {"type": "frobnicate"},
        {"type": "selector", "children": []},
        {"type": "parallel", "success_threshold": 3, "children": [{"type": "succeed"}]},
        {"type": "condition", "name": "dup", "key": "x", "op": "almost"},
        {"type": "set", "key": "a..b"},
        {"type": "wait", "ms": 0},
        {"type": "retry", "max_attempts": -1, "child": {"type": "succeed", "colour": "red"}},
        {"type": "user_input", "input_kind": "select", "prompt": "pick"},
        {"type": "user_input", "input_kind": "voice", "prompt": "say"},
        {"type": "user_input", "input_kind": "text", "prompt": "p",
         "schema": {"type": "no-such-type"}},
        {"type": "tool", "tool": "echo", "policy": "maybe", "args": {"x": {"$ref": 3}}},
        {"type": "approval", "phase": "during"},
        "not a node"
    ]}});
    let got = fields(doc);
    let want = [
        "$.extra",
        "$.id",
        "$.version",
        "$.root.children[0].type",
        "$.root.children[1].children",
        "$.root.children[2].success_threshold",
        "$.root.children[3].name",
        "$.root.children[3].op",
        "$.root.children[4].key",
        "$.root.children[4].value",
        "$.root.children[5].ms",
        "$.root.children[6].max_attempts",
        "$.root.children[6].child.colour",
        "$.root.children[7].options",
        "$.root.children[8].input_kind",
        "$.root.children[9].schema",
        "$.root.children[10].args.x",
        "$.root.children[10].policy",
        "$.root.children[11].phase",
        "$.root.children[11].child",
        "$.root.children[12]",
    ];
    for w in want {
        assert!(got.iter().any(|g| g == w), "missing {w} in {got:#?}");
    }
    assert_eq!(got.len(), want.len(), "{got:#?}");
}

#[test]
fn descriptions_say_what_is_wrong() {
    let errs = errors(
        json!({"id": "t", "version": 1, "root": {"type": "sequence", "children": [
        {"type": "succeed", "name": "x"}, {"type": "fail", "name": "x"}]}}),
    );
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "$.root.children[1].name");
    assert!(
        errs[0].description.contains("duplicate node name 'x'"),
        "{}",
        errs[0]
    );
}

#[test]
fn syntax_errors_and_non_objects_are_single_violations() {
    let e = parse_tree("{", TreeFormat::Json).unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].field, "$");
    assert_eq!(fields(json!([1])), vec!["$"]);
    assert_eq!(fields(json!({"id": "t", "version": 1})), vec!["$.root"]);
}

#[test]
fn depth_and_size_limits_are_enforced() {
    let mut node = json!({"type": "succeed"});
    for _ in 0..64 {
        node = json!({"type": "inverter", "child": node});
    }
    let errs = errors(json!({"id": "t", "version": 1, "root": node}));
    assert!(
        errs[0].description.contains("nesting deeper than 64"),
        "{errs:?}"
    );

    let children: Vec<Json> = (0..100_001).map(|_| json!({"type": "succeed"})).collect();
    let errs = errors(json!({"id": "t", "version": 1, "root":
        {"type": "sequence", "children": children}}));
    assert_eq!(errs.len(), 1);
    assert!(errs[0].description.contains("more than 100000 nodes"));
}

#[test]
fn yaml_is_accepted_and_canonical_json_reparses_to_the_same_spec() {
    let yaml = r#"
id: deploy-service
version: 3
root:
  type: sequence
  name: deploy
  children:
    - {type: set, key: plan, value: {service: billing, replicas: 3}}
    - type: approval
      name: approve-deploy
      context: [plan]
      child: {type: tool, tool: ledger.append, args: {entry: {$ref: plan}}, output: receipt}
"#;
    let spec = parse_tree(yaml, TreeFormat::Yaml).unwrap();
    assert_eq!(
        (spec.id(), spec.version(), spec.node_count()),
        ("deploy-service", 3, 4)
    );
    let canonical = spec.canonical_json();
    let again = parse_tree(&canonical, TreeFormat::Json).unwrap();
    assert_eq!(again, spec);
    assert_eq!(again.canonical_json(), canonical);
    assert!(
        canonical.starts_with(r#"{"id":"deploy-service","root":"#),
        "{canonical}"
    );
    let locators: Vec<&str> = spec.locators().collect();
    assert_eq!(locators, vec!["deploy", "0", "approve-deploy", "1/0"]);
}

#[test]
fn odd_schemas_are_violations_not_panics() {
    for schema in [
        json!({"$schema": "http://example.com/unknown-draft"}),
        json!({"$ref": "http://example.com/remote.json"}),
        json!({"$ref": "#/definitions/missing"}),
        json!({"type": 5}),
        json!("string"),
        json!({"pattern": "("}),
    ] {
        let doc = json!({"id": "t", "version": 1, "root": {"type": "user_input",
            "input_kind": "json", "prompt": "p", "schema": schema}});
        let errs = parse_tree(&doc.to_string(), TreeFormat::Json).unwrap_err();
        assert_eq!(errs.len(), 1, "{schema}: {errs:?}");
        assert_eq!(errs[0].field, "$.root.schema");
    }
}

#[test]
fn json_nested_past_the_parser_limit_reports_depth() {
    let mut node = json!({"type": "succeed"});
    for _ in 0..70 {
        node = json!({"type": "sequence", "children": [node]});
    }
    let errs = errors(json!({"id": "t", "version": 1, "root": node}));
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].description.starts_with("nesting deeper than 64"),
        "{}",
        errs[0]
    );
}

#[test]
fn yaml_nested_deeper_than_json_may_be_is_refused_before_parsing() {
    // Parsing this would take the YAML parser minutes of CPU (quadratic in the depth).
    let bomb = "{a: ".repeat(1_000_000);
    let errs = parse_tree(&bomb, TreeFormat::Yaml).unwrap_err();
    assert_eq!(errs[0].field, "$");
    assert!(errs[0].description.contains("deeper than 128"), "{errs:?}");
    // Nesting within the limit is still parsed (and then validated as a tree).
    let nested = format!(
        "id: x\nversion: 1\nroot: {{type: set, key: k, value: {}1{}}}",
        "[".repeat(100),
        "]".repeat(100)
    );
    assert!(parse_tree(&nested, TreeFormat::Yaml).is_ok());
}

#[test]
fn tool_decision_fields_are_checked_and_enum_errors_list_the_accepted_values() {
    let tool = |extra: Json| {
        let mut node = json!({"type": "tool", "name": "t", "tool": "echo"});
        for (k, v) in extra.as_object().unwrap() {
            node[k] = v.clone();
        }
        errors(json!({"id": "t", "version": 1, "root": node}))
    };
    let e = tool(json!({"resume_mode": "pass_decision_to_tool", "allow_edit": false}));
    assert_eq!(e[0].field, "$.root.allow_edit");
    let e = tool(json!({"reject_output": 1}));
    assert_eq!(e[0].field, "$.root.reject_output");
    let e = tool(json!({"allow_respond": "yes"}));
    assert_eq!(e[0].description, "must be true or false");
    let e = tool(json!({"on_reject": "explode"}));
    assert_eq!(
        e[0].description,
        "unknown value \"explode\"; expected one of: failure, skip"
    );
    let e = tool(json!({"policy": "maybe"}));
    assert_eq!(
        e[0].description,
        "unknown value \"maybe\"; expected one of: allow, deny, ask"
    );
    let e = errors(json!({"id": "t", "version": 1, "root":
        {"type": "approval", "phase": "during", "child": {"type": "succeed"}}}));
    assert_eq!(
        e[0].description,
        "unknown value \"during\"; expected one of: before, after, both"
    );
    let e = errors(json!({"id": "t", "version": 1, "root":
        {"type": "condition", "key": "x", "op": "almost", "value": 1}}));
    assert!(
        e[0].description
            .ends_with("expected one of: eq, ne, gt, ge, lt, le, exists, not_exists, truthy"),
        "{e:?}"
    );
}

#[test]
fn an_unknown_node_type_lists_every_type_there_is() {
    let e = errors(json!({"id": "t", "version": 1, "root": {"type": "teleport"}}));
    let listed = e[0].description.split("expected one of: ").nth(1).unwrap();
    for ty in listed.split(", ") {
        let doc = json!({"id": "t", "version": 1, "root": {"type": ty}});
        let got = parse_tree(&doc.to_string(), TreeFormat::Json)
            .err()
            .unwrap_or_default();
        assert!(
            got.iter()
                .all(|v| !v.description.starts_with("unknown node type")),
            "{ty} is listed but unknown: {got:?}"
        );
    }
    assert_eq!(listed.split(", ").count(), 20);
}
