//! The validating policies on AgentRuns: the creator stamp stays honest, and nobody but the
//! controller moves a run.

use super::builders::{
    Message, Validating, match_condition, match_resources, validating, validation, variable,
    with_match_conditions,
};
use super::cel::{controller_identity, entry_unchanged, string_list};
use super::{
    CREATED_BY_ANNOTATION, CREATED_BY_IMMUTABLE_MESSAGE, RUN_CREATOR_POLICY,
    RUN_NOT_RUNNING_MESSAGE, RUN_STATUS_MESSAGE, RUN_STATUS_POLICY, WORKER_STATUS_FIELDS,
    annotations_variables,
};

/// `agentrun-run-creator`: [`CREATED_BY_ANNOTATION`] is the creator's own username and never
/// changes.
pub fn run_creator() -> Validating {
    let [annotations, old_annotations] = annotations_variables();
    let key = CREATED_BY_ANNOTATION;
    let validations = vec![
        validation(
            format!(
                "request.operation != 'CREATE' || !('{key}' in variables.annotations) || variables.annotations['{key}'] == request.userInfo.username"
            ),
            Message::Expression(format!(
                "'annotation {key} must be your own username (' + request.userInfo.username + '): it records who created the run'"
            )),
        ),
        validation(
            format!(
                "request.operation != 'UPDATE' || {}",
                entry_unchanged("variables.annotations", "variables.oldAnnotations", key)
            ),
            Message::Fixed(CREATED_BY_IMMUTABLE_MESSAGE),
        ),
    ];
    validating(
        RUN_CREATOR_POLICY,
        match_resources(&["agentruns"], &["CREATE", "UPDATE"]),
        vec![annotations, old_annotations],
        validations,
    )
}

/// `agentrun-run-status`: on `agentruns/status`, a requester that is not a controller identity
/// (a worker, or anyone acting as one: every namespace editor can) may change only
/// [`WORKER_STATUS_FIELDS`], and only while the run is `Running`. Every other status field,
/// present or added later, must come out unchanged: the rule compares the keys of the old and
/// the new status, not a list of protected fields.
pub fn run_status() -> Validating {
    let variables = vec![
        variable("workerFields", string_list(&WORKER_STATUS_FIELDS)),
        variable("status", "has(object.status) ? object.status : {}"),
        variable("oldStatus", "has(oldObject.status) ? oldObject.status : {}"),
        variable(
            "changed",
            "variables.status.filter(k, !(k in variables.workerFields) && !(k in variables.oldStatus && variables.status[k] == variables.oldStatus[k])) + variables.oldStatus.filter(k, !(k in variables.workerFields) && !(k in variables.status))",
        ),
        variable(
            "phase",
            "'phase' in variables.oldStatus ? string(variables.oldStatus.phase) : ''",
        ),
    ];
    let validations = vec![
        validation(
            "size(variables.changed) == 0",
            Message::Expression(format!(
                "'{RUN_STATUS_MESSAGE}: ' + variables.changed.join(', ') + ' (a worker writes only ' + variables.workerFields.join(', ') + ')'"
            )),
        ),
        validation(
            "variables.phase == 'Running'",
            Message::Expression(format!(
                "'{RUN_NOT_RUNNING_MESSAGE} (it is ' + (variables.phase == '' ? 'not started' : variables.phase) + ')'"
            )),
        ),
    ];
    with_match_conditions(
        validating(
            RUN_STATUS_POLICY,
            match_resources(&["agentruns/status"], &["UPDATE"]),
            variables,
            validations,
        ),
        vec![match_condition(
            "not-a-controller-identity",
            format!("!({})", controller_identity()),
        )],
    )
}
