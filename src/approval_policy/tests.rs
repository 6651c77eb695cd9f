use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::crd::ApprovalPolicySpec;

fn policy(name: &str, yaml: &str) -> Arc<CompiledPolicy> {
    let spec: ApprovalPolicySpec = serde_yaml_ng::from_str(yaml).unwrap();
    Arc::new(CompiledPolicy::compile(&ApprovalPolicy::new(name, spec)))
}

const PROD_WRITES: &str = r#"
namespaceSelector: {matchLabels: {tier: prod}}
rules:
- {name: small-refunds, tools: [refund], when: "args.amount <= 100", action: Allow}
- {name: no-drops, tools: ["drop_*"], action: Deny, message: "Dropping tables is not allowed from agents."}
- name: big-refunds
  tools: [refund]
  when: "args.amount > 1000"
  action: Require
  requiredApprovals: 2
  approvers: {groups: ["finance:approvers"]}
"#;

fn decide(
    policies: &[Arc<CompiledPolicy>],
    tool: &str,
    args: serde_json::Value,
) -> Option<Requirement> {
    let labels = BTreeMap::from([("team".to_owned(), "payments".to_owned())]);
    evaluate(
        policies,
        &CallFacts {
            tool,
            args: &args,
            agent: "ops",
            namespace: "shop",
            run: "r1",
            labels: &labels,
        },
    )
}

#[test]
fn the_first_matching_rule_decides() {
    let p = [policy("prod-writes", PROD_WRITES)];
    assert!(p[0].errors().is_empty(), "{:?}", p[0].errors());
    let small = decide(&p, "refund", json!({"amount": 50})).unwrap();
    assert_eq!(small.decision.action, PolicyAction::Allow);
    assert_eq!(
        small.decision.approver_id(),
        "policy:prod-writes/small-refunds"
    );
    assert_eq!(small.required_approvals, None);
    let drop = decide(&p, "drop_table", json!({})).unwrap();
    assert_eq!(drop.decision.action, PolicyAction::Deny);
    assert_eq!(
        drop.decision.message.as_deref(),
        Some("Dropping tables is not allowed from agents.")
    );
    let big = decide(&p, "refund", json!({"amount": 5000})).unwrap();
    assert_eq!(big.decision.action, PolicyAction::Require);
    assert_eq!(big.required_approvals, Some(2));
    assert_eq!(big.approvers.unwrap().groups, vec!["finance:approvers"]);
    assert_eq!(
        decide(&p, "refund", json!({"amount": 500})),
        None,
        "no rule matched"
    );
    assert_eq!(decide(&p, "lookup", json!({})), None);
    assert_eq!(gates(&p), vec!["drop_*", "refund"]);
}

#[test]
fn conditions_see_the_call_and_the_run() {
    let p = [policy(
        "ctx",
        r#"
rules:
- name: all
  tools: ["*"]
  when: "tool == 'refund' && agent == 'ops' && run.namespace == 'shop' && run.name == 'r1' && run.labels.team == 'payments' && labels.team == 'payments' && args.items.all(i, i > 0) && args.note.startsWith('x') && args.ratio < 0.5"
  action: Deny
"#,
    )];
    let args = json!({"items": [1, 2], "note": "xy", "ratio": 0.25});
    let r = decide(&p, "refund", args).unwrap();
    assert_eq!(
        r.decision.action,
        PolicyAction::Deny,
        "{:?}",
        r.decision.note
    );
}

#[test]
fn a_condition_that_does_not_compile_or_fails_needs_a_person() {
    let p = [policy(
        "broken",
        r#"
rules:
- {name: typo, tools: [refund], when: "args.amount >", action: Allow}
- {name: missing-field, tools: [pay], when: "args.nope > 1", action: Allow}
- {name: not-bool, tools: [send], when: "args.amount", action: Deny, message: m}
"#,
    )];
    let errors = p[0].errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("rule typo: when: "), "{errors:?}");
    for tool in ["refund", "pay", "send"] {
        let r = decide(&p, tool, json!({"amount": 1})).unwrap();
        assert_eq!(r.decision.action, PolicyAction::Require, "{tool}");
        assert_eq!(r.required_approvals, Some(1), "{tool}");
        assert_eq!(r.decision.message, None, "{tool}");
        let note = r.decision.note.unwrap();
        assert!(
            note.contains("could not be evaluated") && note.contains("a person decides"),
            "{note}"
        );
    }
}

#[test]
fn the_strictest_policy_wins_and_selectors_choose_namespaces() {
    let allow = policy(
        "a-allow",
        "rules: [{name: r, tools: [refund], action: Allow}]",
    );
    let two = policy(
        "b-two",
        "rules: [{name: r, tools: [refund], action: Require, requiredApprovals: 2}]",
    );
    let three = policy(
        "c-three",
        "rules: [{name: r, tools: ['ref*'], action: Require, requiredApprovals: 3}]",
    );
    let deny = policy(
        "d-deny",
        "rules: [{name: r, tools: [refund], action: Deny}]",
    );
    let r = decide(
        &[allow.clone(), two.clone(), three.clone()],
        "refund",
        json!({}),
    )
    .unwrap();
    assert_eq!(r.decision.name.as_deref(), Some("c-three"));
    assert_eq!(r.required_approvals, Some(3));
    let r = decide(&[three, deny, allow.clone()], "refund", json!({})).unwrap();
    assert_eq!(r.decision.action, PolicyAction::Deny);
    let r = decide(&[two.clone(), allow], "refund", json!({})).unwrap();
    assert_eq!(r.decision.name.as_deref(), Some("b-two"));

    let prod = policy("prod", PROD_WRITES);
    assert!(prod.selects(&BTreeMap::from([("tier".into(), "prod".into())])));
    assert!(!prod.selects(&BTreeMap::new()));
    assert!(
        two.selects(&BTreeMap::new()),
        "no selector: every namespace"
    );
}

#[test]
fn gates_match_tool_names_with_globs() {
    let gates = Gates::new(&["drop_*".to_owned(), "refund".to_owned()]);
    assert!(gates.matches("drop_table") && gates.matches("refund"));
    assert!(!gates.matches("refunds") && !gates.matches("lookup"));
    assert!(!Gates::new(&[]).matches("refund"));
    assert!(
        Gates::new(&["[".to_owned()]).matches("anything"),
        "fails closed"
    );
}
