//! What the pages show, read as the person (and the decisions they write): the pending requests
//! of the namespaces they can list, one request with its run's conversation, a run's audit.
//!
//! The reading and joining is the kubectl plugin's ([`crate::plugin`]): the same
//! [`Session`](crate::plugin::Session) lookups, the same pending filter, conversation view and
//! audit entries, so the console and `kubectl agentrun` never disagree.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::access::{ApiFailure, timed};
use crate::chunk_store;
use crate::crd::{AgentRun, ApprovalRequest, Decision};
use crate::plugin::Session;
use crate::plugin::audit::{AuditReport, report};
use crate::plugin::decide::DecisionInput;
use crate::plugin::listing::is_pending;
use crate::plugin::show::{RunView, view};
use crate::state::RunState;
use crate::time::try_from_k8s as to_utc;

/// The field manager of the decisions the console writes.
pub const FIELD_MANAGER: &str = "agentrun-console";

/// Where the inbox looks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The person may list ApprovalRequests in all namespaces.
    AllNamespaces,
    /// They may not: these namespaces (the console's and the page's, and those the person may
    /// list Namespaces to find), each tried on its own.
    Namespaces(Vec<String>),
}

/// One request waiting for a decision, as the inbox shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxRow {
    /// The request's namespace.
    pub namespace: String,
    /// The request's name.
    pub name: String,
    /// The run that halted.
    pub run: String,
    /// The tool the model wants to call.
    pub tool: String,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// Who created the run (the verified identity the controller copied), if recorded.
    pub requester: Option<String>,
    /// When the request was created.
    pub created: Option<DateTime<Utc>>,
    /// When it expires, if its tool has an approval timeout.
    pub expires: Option<DateTime<Utc>>,
    /// Quorum progress (`approved/required`), when the request needs several approvals.
    pub quorum: Option<String>,
}

/// The inbox: the pending requests, oldest first, and the namespaces that could not be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inbox {
    /// The pending requests, oldest first.
    pub rows: Vec<InboxRow>,
    /// What was looked at, for the page (`all namespaces`, `namespaces a, b`).
    pub scope: String,
    /// Namespaces whose requests the person may not list, with the API server's message.
    pub unreadable: Vec<(String, String)>,
}

fn requests_resource() -> ApiResource {
    ApiResource::erase::<ApprovalRequest>(&())
}

/// Where the person's inbox looks: all namespaces when they may list ApprovalRequests
/// cluster-wide, else `namespaces` plus every namespace they may list.
pub async fn scope(client: &Client, namespaces: &[String]) -> Result<Scope, ApiFailure> {
    let all: Api<ApprovalRequest> = Api::all(client.clone());
    match timed(
        "list approvalrequests in all namespaces",
        all.list_metadata(&ListParams::default().limit(1)),
    )
    .await
    {
        Ok(_) => return Ok(Scope::AllNamespaces),
        Err(failure) if failure.is_forbidden() => {}
        Err(failure) => return Err(failure),
    }
    let mut found: BTreeSet<String> = namespaces.iter().cloned().collect();
    let api: Api<Namespace> = Api::all(client.clone());
    match timed("list namespaces", api.list_metadata(&ListParams::default())).await {
        Ok(list) => found.extend(list.items.into_iter().map(|n| n.name_any())),
        Err(failure) if failure.is_forbidden() => {}
        Err(failure) => return Err(failure),
    }
    Ok(Scope::Namespaces(found.into_iter().collect()))
}

/// `approved/required` for a request that needs several approvals: the distinct people who
/// voted Approved under `spec.votes`, against `spec.requiredApprovals`.
fn quorum(request: &ApprovalRequest) -> Option<String> {
    request.spec.is_quorum().then(|| {
        let approved = request
            .spec
            .votes
            .values()
            .filter(|v| v.decision == Decision::Approved)
            .count();
        format!("{approved}/{}", request.spec.approvals_needed())
    })
}

fn rows_of(objects: Vec<DynamicObject>) -> Vec<InboxRow> {
    objects
        .into_iter()
        .filter_map(|object| {
            let request: ApprovalRequest = serde_json::to_value(&object)
                .ok()
                .and_then(|v| serde_json::from_value(v).ok())?;
            is_pending(&request).then(|| InboxRow {
                namespace: request.namespace().unwrap_or_default(),
                name: request.name_any(),
                run: request.spec.agent_run_ref.name.clone(),
                tool: request.spec.tool_name.clone(),
                tool_call_id: request.spec.tool_call_id.clone(),
                requester: request.spec.run_creator.clone(),
                created: request
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(to_utc),
                expires: request
                    .status
                    .as_ref()
                    .and_then(|s| s.expires_at.as_ref())
                    .and_then(to_utc),
                quorum: quorum(&request),
            })
        })
        .collect()
}

/// The pending requests of `scope`, oldest first.
pub async fn inbox(client: &Client, scope: &Scope) -> Result<Inbox, ApiFailure> {
    let resource = requests_resource();
    let mut inbox = Inbox::default();
    match scope {
        Scope::AllNamespaces => {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let list = timed(
                "list approvalrequests in all namespaces",
                api.list(&ListParams::default()),
            )
            .await?;
            inbox.rows = rows_of(list.items);
            "all namespaces".clone_into(&mut inbox.scope);
        }
        Scope::Namespaces(namespaces) => {
            let lists = join_all(namespaces.iter().map(|ns| {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
                async move {
                    let action = format!("list approvalrequests in namespace {ns}");
                    (ns, timed(&action, api.list(&ListParams::default())).await)
                }
            }))
            .await;
            for (ns, result) in lists {
                match result {
                    Ok(list) => inbox.rows.extend(rows_of(list.items)),
                    Err(failure) if failure.is_forbidden() => {
                        inbox.unreadable.push((ns.clone(), failure.message));
                    }
                    Err(failure) => return Err(failure),
                }
            }
            inbox.scope = if namespaces.is_empty() {
                "no namespace".to_owned()
            } else {
                format!("namespaces {}", namespaces.join(", "))
            };
        }
    }
    inbox.rows.sort_by(|a, b| {
        (a.created, &a.namespace, &a.name).cmp(&(b.created, &b.namespace, &b.name))
    });
    Ok(inbox)
}

/// A request with what the person may read of its run.
#[derive(Clone, Debug)]
pub struct RequestData {
    /// The request.
    pub request: ApprovalRequest,
    /// The run (`Err` with the API server's message when it cannot be read).
    pub run: Result<AgentRun, String>,
    /// The run as `kubectl agentrun show` presents it (its conversation), when readable.
    pub view: Option<RunView>,
}

fn session(client: &Client, namespace: &str) -> Session {
    Session {
        client: client.clone(),
        namespace: namespace.to_owned(),
    }
}

/// The run `name` and its decoded state and requests, as the plugin reads them.
async fn run_with_state(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(AgentRun, Option<RunState>, Vec<ApprovalRequest>), String> {
    let session = session(client, namespace);
    let run = session.run(name).await.map_err(|e| e.to_string())?;
    let state = chunk_store::load(client, &run)
        .await
        .map_err(|e| format!("cannot read the state of agentrun {name}: {e}"))?;
    let requests = session.requests_of(&run).await.map_err(|e| e.to_string())?;
    Ok((run, state, requests))
}

/// The request `name` of `namespace` and its run's conversation.
pub async fn request(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<RequestData, ApiFailure> {
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), namespace);
    let action = format!("get approvalrequest {name} in namespace {namespace}");
    let request = timed(&action, api.get(name)).await?;
    let run_name = request.spec.agent_run_ref.name.clone();
    let (run, view) = match run_with_state(client, namespace, &run_name).await {
        Ok((run, state, requests)) => {
            let shown = view(&run, state.as_ref(), &requests);
            (Ok(run), Some(shown))
        }
        Err(message) => (Err(message), None),
    };
    Ok(RequestData { request, run, view })
}

/// The audit of run `name` (every call, its decision, verified identity, times, whether it ran).
pub async fn audit(client: &Client, namespace: &str, name: &str) -> Result<AuditReport, String> {
    let (run, state, requests) = run_with_state(client, namespace, name).await?;
    Ok(report(&run, state.as_ref(), &requests))
}

/// What a person decided in the console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionForm {
    /// Approved or Rejected.
    pub decision: Decision,
    /// Why (audit only).
    pub reason: String,
    /// Rejected only: what the model is told.
    pub message: Option<String>,
    /// Approved only: the arguments approved instead of the model's (a JSON object).
    pub edited_arguments: Option<String>,
    /// The uid of the request the page showed.
    pub uid: String,
    /// The arguments digest the page showed.
    pub arguments_digest: String,
}

/// The merge patch of a decision: the fields `kubectl agentrun approve/reject` writes — on a
/// request one person decides, `spec.decision`, `approverId`, `reason` (and `message` when
/// rejecting, `editedArguments` when approving edited arguments); on one that needs several
/// approvals, the person's own vote under `spec.votes` — with the uid of the request the person
/// was shown as a precondition (`metadata.uid`: the API server refuses the patch if the request
/// was replaced). Every field the console writes on a decision is here.
pub fn decision_patch(
    input: &DecisionInput,
    request: &ApprovalRequest,
    approver: &str,
    uid: &str,
) -> serde_json::Value {
    let mut patch = if request.spec.is_quorum() {
        input.vote_patch(approver)
    } else {
        input.merge_patch(approver)
    };
    patch["metadata"] = json!({ "uid": uid });
    patch
}

/// Writes the decision on request `name` as `approver` (the person's username, as the API
/// server authenticated it): the merge patch of `kubectl agentrun approve/reject`, with the uid
/// of the request the person was shown as a precondition, after checking that its arguments are
/// still the ones shown. The API server's refusal (not an approver, separation of duties,
/// already decided, expired) comes back as is.
pub async fn decide(
    client: &Client,
    namespace: &str,
    name: &str,
    approver: &str,
    form: &DecisionForm,
) -> Result<ApprovalRequest, ApiFailure> {
    let verb = match form.decision {
        Decision::Approved => "approve",
        Decision::Rejected => "reject",
    };
    let action = format!("{verb} approvalrequest {name} in namespace {namespace}");
    let input = DecisionInput {
        decision: form.decision,
        reason: form.reason.clone(),
        message: form.message.clone(),
        edited_arguments: form.edited_arguments.clone(),
    };
    input.validate().map_err(|e| ApiFailure {
        action: action.clone(),
        code: Some(422),
        message: e.to_string().replace("invalid --", "invalid "),
    })?;
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), namespace);
    let current = timed(&action, api.get(name)).await?;
    if current.uid().as_deref() != Some(form.uid.as_str())
        || current.spec.arguments_digest != form.arguments_digest
    {
        return Err(ApiFailure {
            action,
            code: Some(409),
            message: "this request is not the one the page showed (it was replaced, or its \
                      arguments differ): reload the page and check it again"
                .to_owned(),
        });
    }
    if current.spec.is_quorum() {
        if input.edited_arguments.is_some() {
            return Err(ApiFailure {
                action,
                code: Some(422),
                message: format!(
                    "this request needs {} approvals: arguments can be edited only on a request \
                     one person decides",
                    current.spec.approvals_needed()
                ),
            });
        }
        if let Some(vote) = current.spec.votes.get(approver) {
            return Err(ApiFailure {
                action,
                code: Some(409),
                message: format!("you already voted on this request: {}", vote.decision),
            });
        }
    }
    let patch = decision_patch(&input, &current, approver, &form.uid);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    timed(&action, api.patch(name, &params, &Patch::Merge(&patch))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(status: serde_json::Value, created: &str) -> DynamicObject {
        object_with(json!({}), status, created)
    }

    fn object_with(
        spec: serde_json::Value,
        status: serde_json::Value,
        created: &str,
    ) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "ApprovalRequest",
            "metadata": {"name": format!("r-{created}"), "namespace": "ns",
                         "creationTimestamp": created},
            "spec": {"agentRunRef": {"name": "r", "uid": "u"}, "step": 0,
                     "toolCallId": "c", "toolName": "t", "arguments": "{}",
                     "argumentsDigest": crate::crd::arguments_digest("{}"),
                     "runCreator": "carol@example.com"},
            "status": status,
        });
        for (key, value) in spec.as_object().unwrap() {
            object["spec"][key] = value.clone();
        }
        serde_json::from_value(object).unwrap()
    }

    fn request(spec: serde_json::Value) -> ApprovalRequest {
        serde_json::from_value(
            serde_json::to_value(object_with(spec, json!({}), "2026-01-01T00:00:00Z")).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn the_decision_patch_is_the_plugins_with_the_uid_as_precondition() {
        let input = DecisionInput {
            decision: Decision::Rejected,
            reason: "not today".into(),
            message: Some("ask again tomorrow".into()),
            edited_arguments: None,
        };
        assert_eq!(
            decision_patch(&input, &request(json!({})), "alice@example.com", "u-1"),
            json!({
                "metadata": {"uid": "u-1"},
                "spec": {"decision": "Rejected", "approverId": "alice@example.com",
                         "reason": "not today", "message": "ask again tomorrow"},
            })
        );
        let edited = DecisionInput {
            decision: Decision::Approved,
            reason: "half".into(),
            message: None,
            edited_arguments: Some(r#"{"amount": 50}"#.into()),
        };
        assert_eq!(
            decision_patch(&edited, &request(json!({})), "alice@example.com", "u-1")["spec"]["editedArguments"],
            json!(r#"{"amount": 50}"#)
        );
    }

    #[test]
    fn on_a_quorum_request_the_patch_is_the_persons_own_vote() {
        let input = DecisionInput {
            decision: Decision::Approved,
            reason: "ok".into(),
            message: None,
            edited_arguments: None,
        };
        let quorum = request(json!({"requiredApprovals": 2}));
        assert_eq!(
            decision_patch(&input, &quorum, "bob@example.com", "u-2"),
            json!({
                "metadata": {"uid": "u-2"},
                "spec": {"votes": {"bob@example.com": {"decision": "Approved", "reason": "ok"}}},
            })
        );
    }

    #[test]
    fn pending_rows_carry_requester_expiry_and_quorum_when_present() {
        let rows = rows_of(vec![
            object(
                json!({"phase": "Pending", "expiresAt": "2030-01-01T00:00:00Z"}),
                "2026-01-01T00:00:00Z",
            ),
            object(json!({"phase": "Expired"}), "2026-01-01T00:00:01Z"),
            object_with(
                json!({"requiredApprovals": 3, "votes": {
                    "a": {"decision": "Approved", "reason": "ok"},
                    "b": {"decision": "Approved", "reason": "ok"},
                }}),
                json!({"phase": "Pending"}),
                "2026-01-01T00:00:02Z",
            ),
        ]);
        assert_eq!(rows.len(), 2, "the expired request is not pending");
        assert_eq!(rows[0].requester.as_deref(), Some("carol@example.com"));
        assert!(rows[0].expires.is_some());
        assert_eq!(rows[0].quorum, None);
        assert_eq!(rows[1].quorum.as_deref(), Some("2/3"));
    }
}
