//! How a deployment answers right now ([`LockClient::health`](crate::LockClient::health)): each
//! server asked with a `PING`, how fast it answered, and whether locks can be taken.

use std::fmt;
use std::time::Duration;

/// What [`LockClient::health`](crate::LockClient::health) found: every server of the deployment,
/// whether it answers and how fast, and whether locks can be taken (ready). Print it (`Display`)
/// for an operator, or read its parts for a readiness probe.
///
/// ```text
/// redlock: ready, 2 of 3 masters answer (2 needed)
///   127.0.0.1:6380  master  answers in 0.21 ms
///   127.0.0.1:6381  master  answers in 0.19 ms
///   127.0.0.1:6382  master  no answer: cannot reach 127.0.0.1:6382: Connection refused (os error 111)
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    deployment: String,
    ready: bool,
    verdict: String,
    nodes: Vec<NodeHealth>,
}

impl Health {
    pub(crate) fn new(
        deployment: impl Into<String>,
        ready: bool,
        verdict: impl Into<String>,
        nodes: Vec<NodeHealth>,
    ) -> Self {
        // A server that refused did answer: "does not answer" would send the operator looking
        // for a network fault instead of a password.
        let verdict = match nodes.as_slice() {
            [] => verdict.into(),
            [node] if node.refused() => "the server refuses the connection".to_owned(),
            all if all.iter().all(NodeHealth::refused) => {
                format!("all {} servers refuse the connection", all.len())
            }
            _ => verdict.into(),
        };
        Self {
            deployment: deployment.into(),
            ready,
            verdict,
            nodes,
        }
    }

    /// Whether locks can be taken: the server answers (one Redis; on Sentinel, the master the
    /// sentinels name), a majority of the masters answer (Redlock), every slot's master answers
    /// (Cluster).
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Which deployment: `redis`, `sentinel` (with its service), `cluster`, `redlock`,
    /// `in memory`.
    pub fn deployment(&self) -> &str {
        &self.deployment
    }

    /// Why it is ready or not, in words: how many answer of how many needed.
    pub fn verdict(&self) -> &str {
        &self.verdict
    }

    /// Every server asked.
    pub fn nodes(&self) -> &[NodeHealth] {
        &self.nodes
    }

    /// How many of the servers answered.
    pub fn answering(&self) -> usize {
        self.nodes.iter().filter(|node| node.answers()).count()
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.ready { "ready" } else { "NOT READY" };
        write!(f, "{}: {state}, {}", self.deployment, self.verdict)?;
        let width = self
            .nodes
            .iter()
            .map(|node| node.address.len())
            .max()
            .unwrap_or(0);
        for node in &self.nodes {
            write!(f, "\n  {:width$}  {node}", node.address)?;
        }
        Ok(())
    }
}

/// One server of a deployment, as [`Health`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    address: String,
    role: NodeRole,
    slots: Option<usize>,
    answer: Result<Duration, String>,
    refused: bool,
}

impl NodeHealth {
    /// `address` in `role` answered after `latency`.
    pub(crate) fn answered(address: impl Into<String>, role: NodeRole, latency: Duration) -> Self {
        Self {
            address: address.into(),
            role,
            slots: None,
            answer: Ok(latency),
            refused: false,
        }
    }

    /// `address` in `role` did not answer, for `why`.
    pub(crate) fn silent(
        address: impl Into<String>,
        role: NodeRole,
        why: impl fmt::Display,
    ) -> Self {
        Self {
            address: address.into(),
            role,
            slots: None,
            answer: Err(why.to_string()),
            refused: false,
        }
    }

    /// The same, refused: for what waiting does not mend (a password, an ACL, a peer that is not
    /// Redis).
    pub(crate) fn refusing(mut self) -> Self {
        self.refused = true;
        self
    }

    /// The same, serving `slots` cluster slots.
    pub(crate) fn serving(mut self, slots: usize) -> Self {
        self.slots = Some(slots);
        self
    }

    /// `host:port` (for an in-memory client, `in memory`).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// What it is in the deployment.
    pub fn role(&self) -> NodeRole {
        self.role
    }

    /// Whether it answered.
    pub fn answers(&self) -> bool {
        self.answer.is_ok()
    }

    /// How long its `PING` took to answer (on a connection already open); `None` when it did not.
    pub fn latency(&self) -> Option<Duration> {
        self.answer.as_ref().ok().copied()
    }

    /// Why it did not answer; `None` when it did.
    pub fn error(&self) -> Option<&str> {
        self.answer.as_ref().err().map(String::as_str)
    }

    /// Whether it answered but refused the connection: a wrong or missing password, an ACL, a
    /// port that does not speak Redis's protocol. Waiting will not mend it; someone must act.
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// How many of a cluster's 16 384 slots it serves (a master's); `None` elsewhere.
    pub fn slots(&self) -> Option<usize> {
        self.slots
    }
}

/// Without its address, which [`Health`]'s lines align: role, slots, and the answer.
impl fmt::Display for NodeHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.role)?;
        if let Some(slots) = self.slots {
            write!(f, " ({slots} slots)")?;
        }
        match &self.answer {
            Ok(latency) => write!(f, "  answers in {:.2} ms", latency.as_secs_f64() * 1e3),
            Err(why) if self.refused => write!(f, "  refused: {why}"),
            Err(why) => write!(f, "  no answer: {why}"),
        }
    }
}

/// What a server is in its deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeRole {
    /// The one server of a one-Redis client (or the in-memory store).
    Server,
    /// A master: the one the sentinels name, one of a Redlock's, or a cluster master.
    Master,
    /// A cluster replica.
    Replica,
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Server => "server",
            Self::Master => "master",
            Self::Replica => "replica",
        })
    }
}
