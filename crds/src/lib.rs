//! AgentSession custom resource types (coming: issue 5).
