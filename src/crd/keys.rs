//! The keys agentrun writes on Kubernetes objects, each defined once: labels, annotations,
//! finalizers and the field managers of its writes.

/// Labels.
pub mod labels {
    /// On every object the controller creates for a run, so selectors and the dev kubelet find
    /// them.
    pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "agentrun");
    /// On every CRD and every object installed with them.
    pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "agentrun");
    /// The run an object belongs to; its value is [`run_label_value`](crate::crd::names::run_label_value).
    pub const RUN: &str = "agentrun.dev/run";
    /// The step a worker Pod runs.
    pub const STEP: &str = "agentrun.dev/step";
    /// The run whose offloaded RunState a RunStateChunk holds.
    pub const STATE_OF: &str = "agentrun.dev/state-of";
    /// On an ApprovalRecord: the namespace of its run.
    pub const NAMESPACE: &str = "agentrun.dev/namespace";
    /// On an ApprovalRecord: the uid of its run.
    pub const RUN_UID: &str = "agentrun.dev/run-uid";
}

/// Annotations.
pub mod annotations {
    /// On an AgentRun: the username of its creator, stamped at CREATE by the admission policy
    /// (the controller copies it to `status.createdBy`).
    pub const CREATED_BY: &str = "agentrun.dev/created-by";
    /// On an ApprovalRequest: the authenticated identity of whoever set the decision, stamped by
    /// the admission policy as JSON `{"username", "uid", "groups"}`.
    pub const DECIDED_BY: &str = "agentrun.dev/decided-by";
    /// On an ApprovalRequest: the commit a GitOps decision comes from.
    pub const GITOPS_COMMIT: &str = "agentrun.dev/gitops-commit";
}

/// Finalizers.
pub mod finalizers {
    /// On AgentRuns: cleanup releases the run's ApprovalRequests.
    pub const RUN_CLEANUP: &str = "agentrun.dev/cleanup";
    /// On ApprovalRequests: keeps each one (the decision record) as long as its run.
    pub const KEEP_WITH_RUN: &str = "agentrun.dev/keep-with-run";
}

/// Field managers of agentrun's writes (server-side apply, patches, creates).
pub mod field_managers {
    /// Every write the controller makes.
    pub const CONTROLLER: &str = "agentrun-controller";
    /// The worker's status writes.
    pub const WORKER: &str = "agentrun-worker";
}
