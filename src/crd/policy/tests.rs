use k8s_openapi::api::admissionregistration::v1::Validation;

use super::super::GROUP;
use super::*;

fn validating(name: &str) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    admission_policies()
        .validating
        .into_iter()
        .find(|(p, _)| p.metadata.name.as_deref() == Some(name))
        .unwrap()
}

fn validations(name: &str) -> Vec<Validation> {
    validating(name).0.spec.unwrap().validations.unwrap()
}

fn resources(policy: &ValidatingAdmissionPolicy) -> Vec<String> {
    let spec = policy.spec.as_ref().unwrap();
    let rules = spec.match_constraints.as_ref().unwrap();
    rules
        .resource_rules
        .iter()
        .flatten()
        .flat_map(|r| r.resources.clone().unwrap())
        .collect()
}

#[test]
fn generation_is_deterministic_and_has_the_header() {
    let a = generate().unwrap();
    let b = generate().unwrap();
    assert_eq!(a, b);
    let names: Vec<_> = a.iter().map(|m| m.file_name).collect();
    assert_eq!(names, [ADMISSION_POLICIES_FILE, ROLES_FILE]);
    for manifest in &a {
        assert!(manifest.yaml.starts_with(POLICY_HEADER));
    }
}

#[test]
fn the_policy_file_holds_each_policy_followed_by_its_binding() {
    let yaml = &generate().unwrap()[0].yaml;
    let kinds_and_names: Vec<(String, String)> = serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| {
            let v = serde_json::Value::deserialize(doc).unwrap();
            (
                v["kind"].as_str().unwrap().to_owned(),
                v["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut expected = vec![];
    for name in [STAMP_CREATOR_POLICY, STAMP_DECIDER_POLICY] {
        expected.push(("MutatingAdmissionPolicy", name));
        expected.push(("MutatingAdmissionPolicyBinding", name));
    }
    for name in [
        APPROVAL_IDENTITY_POLICY,
        GITOPS_APPROVERS_POLICY,
        RUN_CREATOR_POLICY,
        RUN_STATUS_POLICY,
        RECORD_RETENTION_POLICY,
    ] {
        expected.push(("ValidatingAdmissionPolicy", name));
        expected.push(("ValidatingAdmissionPolicyBinding", name));
    }
    let expected: Vec<(String, String)> = expected
        .into_iter()
        .map(|(k, n)| (k.to_owned(), n.to_owned()))
        .collect();
    assert_eq!(kinds_and_names, expected);
}

#[test]
fn policies_fail_closed_and_bindings_deny() {
    let policies = admission_policies();
    for (policy, binding) in &policies.mutating {
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(spec.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(
            binding.spec.as_ref().unwrap().policy_name,
            policy.metadata.name
        );
    }
    for (policy, binding) in &policies.validating {
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        let binding = &binding.spec;
        assert_eq!(Some(&binding.policy_name), policy.metadata.name.as_ref());
        assert_eq!(binding.validation_actions, ["Deny"]);
        let rules = spec.match_constraints.as_ref().unwrap();
        for rule in rules.resource_rules.as_ref().unwrap() {
            assert_eq!(rule.api_groups.as_deref(), Some(&[GROUP.to_owned()][..]));
        }
        // Only agentrun-run-status matches a subresource (the status the workers write).
        let is_status = policy.metadata.name.as_deref() == Some(RUN_STATUS_POLICY);
        for resource in resources(policy) {
            assert_eq!(resource.contains('/'), is_status, "{resource}");
        }
        for v in spec.validations.as_ref().unwrap() {
            assert!(
                v.message.is_some() || v.message_expression.is_some(),
                "{}",
                v.expression
            );
        }
    }
    let (status, _) = validating(RUN_STATUS_POLICY);
    assert_eq!(resources(&status), ["agentruns/status"]);
}

#[test]
fn the_identity_checks_name_the_gitops_group_and_annotations() {
    let rules = validations(APPROVAL_IDENTITY_POLICY);
    let identity = rules[0].message_expression.as_deref().unwrap();
    for needle in [
        APPROVER_IDENTITY_MESSAGE,
        GITOPS_GROUP,
        GITOPS_COMMIT_ANNOTATION,
    ] {
        assert!(identity.contains(needle), "{identity}");
    }
    assert!(
        rules[1]
            .message_expression
            .as_deref()
            .unwrap()
            .contains("cannot decide its own requests")
    );
    // Separation of duties compares normalised identities; approverId is the exact username.
    assert!(
        rules[1]
            .expression
            .contains("variables.runCreatorKey != variables.requesterKey")
    );
    assert!(
        rules[0]
            .expression
            .contains("variables.approver == request.userInfo.username")
    );
    let creator = validations(RUN_CREATOR_POLICY);
    assert_eq!(
        creator[1].message.as_deref(),
        Some(CREATED_BY_IMMUTABLE_MESSAGE)
    );
}

#[test]
fn gitops_decisions_are_checked_against_the_allow_list_and_fail_closed() {
    let (policy, binding) = validating(GITOPS_APPROVERS_POLICY);
    let spec = policy.spec.unwrap();
    // No parameter: nothing to be missing or stale (see decisions::gitops_approvers).
    assert!(spec.param_kind.is_none());
    assert!(binding.spec.param_ref.is_none());
    assert!(binding.spec.match_resources.is_none());
    let conditions = spec.match_conditions.unwrap();
    assert_eq!(conditions.len(), 1);
    assert!(conditions[0].expression.contains(GITOPS_GROUP));
    // The list is the first variable and empty as generated: GitOps decisions are refused.
    let variables = spec.variables.unwrap();
    assert_eq!(variables[0].name, GITOPS_ALLOW_LIST_VARIABLE);
    assert_eq!(variables[0].expression, "[]");
    let allowed = &variables
        .iter()
        .find(|v| v.name == "allowed")
        .unwrap()
        .expression;
    assert!(allowed.contains(".trim().lowerAscii()"), "{allowed}");
    let validations = spec.validations.unwrap();
    assert_eq!(
        validations[0].expression,
        "!variables.decisionIsNew || size(variables.allowed) > 0"
    );
    // An admin's list is a CEL list of JSON strings, kept as written.
    assert_eq!(
        gitops_allow_list(&["alice@example.com", " Bob \"B\" "]),
        r#"["alice@example.com"," Bob \"B\" "]"#
    );
    let (configured, _) = gitops_approvers_with(&["alice@example.com"]);
    let variables = configured.spec.unwrap().variables.unwrap();
    assert_eq!(variables[0].expression, r#"["alice@example.com"]"#);
}

#[test]
fn only_controller_identities_escape_the_run_and_record_policies() {
    for name in [RUN_STATUS_POLICY, RECORD_RETENTION_POLICY] {
        let spec = validating(name).0.spec.unwrap();
        let conditions = spec.match_conditions.unwrap();
        assert_eq!(conditions.len(), 1, "{name}");
        let condition = &conditions[0].expression;
        assert!(condition.starts_with("!("), "{condition}");
        assert!(condition.contains("'system:masters'"), "{condition}");
        assert!(
            condition.contains(&format!(".check('{CONTROLLER_VERB}').allowed()")),
            "{condition}"
        );
    }
    let status = validating(RUN_STATUS_POLICY).0.spec.unwrap();
    let variables = status.variables.unwrap();
    let fields = &variables[0].expression;
    for field in WORKER_STATUS_FIELDS {
        assert!(fields.contains(&format!("'{field}'")), "{fields}");
    }
    // Robust to fields added later: the rule walks the keys of both statuses.
    let changed = &variables
        .iter()
        .find(|v| v.name == "changed")
        .unwrap()
        .expression;
    assert!(changed.contains("variables.status.filter(k,"), "{changed}");
    assert!(
        changed.contains("variables.oldStatus.filter(k,"),
        "{changed}"
    );
    let retention = validations(RECORD_RETENTION_POLICY);
    let messages: Vec<_> = retention
        .iter()
        .map(|v| v.message.as_deref().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            REQUEST_FINALIZERS_MESSAGE,
            REQUEST_OWNERS_MESSAGE,
            REQUEST_RUN_LABEL_MESSAGE,
            RUN_CLEANUP_MESSAGE
        ]
    );
}

/// The Helm chart sets the allow-list by the variable's name: it must be there once.
#[test]
fn the_chart_finds_the_allow_list_variable() {
    let yaml = &generate().unwrap()[0].yaml;
    assert_eq!(
        yaml.matches(&format!("name: {GITOPS_ALLOW_LIST_VARIABLE}"))
            .count(),
        1
    );
}

/// Messages built into CEL string literals cannot hold a single quote.
#[test]
fn messages_inside_cel_literals_have_no_quotes() {
    for message in [
        APPROVER_IDENTITY_MESSAGE,
        SEPARATION_OF_DUTIES_MESSAGE,
        GITOPS_EMPTY_ALLOW_LIST_MESSAGE,
        GITOPS_NOT_ALLOWED_MESSAGE,
        RUN_STATUS_MESSAGE,
        RUN_NOT_RUNNING_MESSAGE,
        GITOPS_GROUP,
        CONTROLLER_VERB,
    ] {
        assert!(!message.contains('\''), "{message}");
    }
}

#[test]
fn the_decided_by_annotation_parses_into_a_verified_identity() {
    let stamp = DecidedBy::parse(
        r#"{"username":"alice@example.com","uid":"uid-alice","groups":["agentrun:approvers","system:authenticated"]}"#,
    )
    .unwrap();
    let identity = stamp.to_verified_identity();
    assert_eq!(identity.username, "alice@example.com");
    assert_eq!(identity.uid.as_deref(), Some("uid-alice"));
    assert_eq!(identity.groups.len(), 2);
    let no_uid = DecidedBy::parse(r#"{"username":"a","uid":"","groups":[]}"#).unwrap();
    assert_eq!(no_uid.to_verified_identity().uid, None);
    let err = DecidedBy::parse(r#"{"username":"a"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains(DECIDED_BY_ANNOTATION), "{err}");
    assert!(DecidedBy::parse("alice").is_err());
    assert!(DecidedBy::parse(r#"{"username":"a","uid":"","groups":[],"x":1}"#).is_err());
}

#[test]
fn write_manifests_writes_and_keeps_up_to_date_files() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_manifests(dir.path()).unwrap();
    assert_eq!(paths.len(), 2);
    for manifest in generate().unwrap() {
        let text = std::fs::read_to_string(dir.path().join(manifest.file_name)).unwrap();
        assert_eq!(text, manifest.yaml);
    }
    let missing = dir.path().join("missing");
    let err = write_manifests(&missing).unwrap_err().to_string();
    assert!(err.contains("missing"), "{err}");
}
