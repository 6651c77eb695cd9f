//! The committed CRDs under `crds/` are exactly what the Rust types generate, and so are the
//! admission policies and roles installed beside them.

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Deserialize;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")
}

/// The first line where two texts differ, for a readable failure.
fn first_difference(committed: &str, generated: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut generated_lines = generated.lines();
    let mut n = 1;
    loop {
        match (committed_lines.next(), generated_lines.next()) {
            (Some(a), Some(b)) if a == b => n += 1,
            (None, None) => return "the files differ only in line endings".to_string(),
            (a, b) => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    a.unwrap_or("<end of file>"),
                    b.unwrap_or("<end of file>")
                );
            }
        }
    }
}

#[test]
fn committed_crds_match_the_rust_types() {
    let generated = agentrun::crd::generate().expect("generate the CRDs");
    let files: Vec<&str> = generated.iter().map(|c| c.file_name).collect();
    assert_eq!(
        files,
        [
            "agent.yaml",
            "agentrun.yaml",
            "approvalrequest.yaml",
            "approvalrecord.yaml",
            "approvalpolicy.yaml",
            "runstatechunk.yaml",
            "notificationsink.yaml",
        ]
    );
    let mut stale = Vec::new();
    for crd in &generated {
        let path = crds_dir().join(crd.file_name);
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == crd.yaml => {}
            Ok(committed) => stale.push(format!(
                "{} differs from the {} type at {}",
                path.display(),
                crd.kind,
                first_difference(&committed, &crd.yaml)
            )),
            Err(e) => stale.push(format!("{} cannot be read: {e}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "the committed CRDs are out of date; run `cargo run -- crdgen` and commit crds/:\n{}",
        stale.join("\n")
    );
}

#[test]
fn committed_crds_parse_back_into_the_generated_definitions() {
    for crd in agentrun::crd::generate().expect("generate the CRDs") {
        let parsed: CustomResourceDefinition =
            serde_yaml_ng::from_str(&crd.yaml).expect("the generated YAML is a CRD");
        assert_eq!(parsed, crd.crd, "{}", crd.file_name);
        assert_eq!(
            parsed.metadata.name.as_deref(),
            Some(format!("{}.agentrun.dev", parsed.spec.names.plural).as_str())
        );
    }
}

#[test]
fn crdgen_command_writes_the_same_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let output = Command::new(env!("CARGO_BIN_EXE_agentrun"))
        .args(["crdgen", "--out"])
        .arg(&out)
        .output()
        .expect("run agentrun crdgen");
    assert!(
        output.status.success(),
        "agentrun crdgen failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    for crd in agentrun::crd::generate().expect("generate the CRDs") {
        let path = out.join(crd.file_name);
        assert!(stdout.contains(&path.display().to_string()), "{stdout}");
        let written = std::fs::read_to_string(&path).expect("read written CRD");
        assert_eq!(written, crd.yaml, "{}", crd.file_name);
    }
}

#[test]
fn crdgen_reports_an_unwritable_folder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("not-a-folder");
    std::fs::write(&file, "x").expect("write file");
    let output = Command::new(env!("CARGO_BIN_EXE_agentrun"))
        .args(["crdgen", "--out"])
        .arg(&file)
        .output()
        .expect("run agentrun crdgen");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("agentrun crdgen: cannot create the folder")
            && stderr.contains("not-a-folder"),
        "{stderr}"
    );
}

#[test]
fn committed_policies_and_roles_match_the_rust_code() {
    let generated = agentrun::crd::policy::generate().expect("generate the policy files");
    let names: Vec<&str> = generated.iter().map(|m| m.file_name).collect();
    assert_eq!(names, ["admission-policies.yaml", "roles.yaml"]);
    let mut stale = Vec::new();
    for manifest in &generated {
        let path = crds_dir().join(manifest.file_name);
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == manifest.yaml => {}
            Ok(committed) => stale.push(format!(
                "{} differs from src/crd/policy.rs at {}",
                path.display(),
                first_difference(&committed, &manifest.yaml)
            )),
            Err(e) => stale.push(format!("{} cannot be read: {e}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "the committed policy files are out of date; run `cargo run -- crdgen` and commit crds/:\n{}",
        stale.join("\n")
    );
}

/// The YAML documents of a multi-document file, as JSON values.
fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| serde_json::Value::deserialize(doc).expect("a YAML document"))
        .collect()
}

#[test]
fn committed_policies_parse_back_into_the_generated_objects() {
    let policies = agentrun::crd::policy::admission_policies();
    let generated = agentrun::crd::policy::generate().expect("generate the policy files");
    let docs = documents(&generated[0].yaml);
    assert_eq!(
        docs.len(),
        2 * (policies.mutating.len() + policies.validating.len())
    );
    let mut docs = docs.into_iter();
    let mut next = || docs.next().expect("one more document");
    for (policy, binding) in &policies.mutating {
        let parsed: MutatingAdmissionPolicy = serde_json::from_value(next()).unwrap();
        assert_eq!(&parsed, policy);
        let parsed: MutatingAdmissionPolicyBinding = serde_json::from_value(next()).unwrap();
        assert_eq!(&parsed, binding);
    }
    for (policy, binding) in &policies.validating {
        let parsed: ValidatingAdmissionPolicy = serde_json::from_value(next()).unwrap();
        assert_eq!(&parsed, policy);
        let parsed: ValidatingAdmissionPolicyBinding = serde_json::from_value(next()).unwrap();
        assert_eq!(&parsed, binding);
    }
    let roles: Vec<ClusterRole> = documents(&generated[1].yaml)
        .into_iter()
        .map(|d| serde_json::from_value(d).expect("a ClusterRole"))
        .collect();
    assert_eq!(roles, agentrun::crd::policy::cluster_roles());
}

#[test]
fn crdgen_command_writes_the_policy_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_agentrun"))
        .args(["crdgen", "--out"])
        .arg(dir.path())
        .output()
        .expect("run agentrun crdgen");
    assert!(
        output.status.success(),
        "agentrun crdgen failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    for manifest in agentrun::crd::policy::generate().expect("generate the policy files") {
        let path = dir.path().join(manifest.file_name);
        assert!(stdout.contains(&path.display().to_string()), "{stdout}");
        let written = std::fs::read_to_string(&path).expect("read written file");
        assert_eq!(written, manifest.yaml, "{}", manifest.file_name);
    }
}
