//! The gateway's one error type, and how each error reads to an HTTP and a
//! gRPC caller. An unauthenticated caller learns nothing about sessions; a
//! forbidden one learns which permission it lacks.

/// What can go wrong on the way to a runner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Unauthenticated(String),
    #[error(
        "{user} may not {verb} agentsessions/{subresource} of {namespace}/{name} (RBAC: verb {verb}, apiGroup agentplane.dev, resource agentsessions/{subresource})"
    )]
    Forbidden {
        user: String,
        verb: &'static str,
        subresource: &'static str,
        namespace: String,
        name: String,
    },
    #[error(
        "{tool} is always_ask in {namespace}/{name}: the call needs an approval (POST .../approvals, or Approve, by a principal with create on agentsessions/approve), then repeat it with the approval"
    )]
    ApprovalRequired {
        tool: String,
        namespace: String,
        name: String,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooManyRequests(String),
    #[error("{0}")]
    Unavailable(String),
    /// The runner answered with an error status: passed on as it is.
    #[error("runner: {}", .0.message())]
    Runner(tonic::Status),
    #[error("{0}")]
    Internal(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot serve on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The short code in HTTP error bodies and SSE error events.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Unauthenticated(_) => "unauthenticated",
            Error::Forbidden { .. } => "forbidden",
            Error::ApprovalRequired { .. } => "approval_required",
            Error::NotFound(_) => "not_found",
            Error::Invalid(_) => "invalid",
            Error::TooManyRequests(_) => "too_many_requests",
            Error::Unavailable(_) => "unavailable",
            Error::Runner(s) => runner_code(s.code()).1,
            Error::Internal(_)
            | Error::Kube(_)
            | Error::Read { .. }
            | Error::Tls(_)
            | Error::Bind { .. } => "internal",
        }
    }

    /// The HTTP status.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Unauthenticated(_) => 401,
            Error::Forbidden { .. } | Error::ApprovalRequired { .. } => 403,
            Error::NotFound(_) => 404,
            Error::Invalid(_) => 400,
            Error::TooManyRequests(_) => 429,
            Error::Unavailable(_) => 503,
            Error::Runner(s) => runner_code(s.code()).0,
            _ => 500,
        }
    }

    /// The gRPC status.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Forbidden { .. } | Error::ApprovalRequired { .. } => Code::PermissionDenied,
            Error::NotFound(_) => Code::NotFound,
            Error::Invalid(_) => Code::InvalidArgument,
            Error::TooManyRequests(_) => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Runner(s) => return s.clone(),
            _ => Code::Internal,
        };
        let mut status = tonic::Status::new(code, self.to_string());
        if let Ok(v) = self.code().parse() {
            status.metadata_mut().insert(REASON_METADATA_KEY, v);
        }
        status
    }

    /// The JSON body of an HTTP error.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code(), "message": self.to_string()}})
    }
}

/// The gRPC metadata key carrying [`Error::code`], so a gRPC client tells
/// an approval that is needed from a permission that is missing.
pub const REASON_METADATA_KEY: &str = "agentplane-reason";

/// A runner's status as HTTP: (status, code).
fn runner_code(code: tonic::Code) -> (u16, &'static str) {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange => (400, "invalid"),
        Code::NotFound => (404, "not_found"),
        Code::AlreadyExists | Code::Aborted => (409, "conflict"),
        Code::PermissionDenied | Code::FailedPrecondition => (403, "refused"),
        Code::ResourceExhausted => (429, "too_many_requests"),
        Code::Unavailable => (503, "unavailable"),
        Code::DeadlineExceeded => (504, "timeout"),
        Code::Cancelled => (499, "cancelled"),
        _ => (502, "runner_error"),
    }
}
