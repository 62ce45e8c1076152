//! The agentplane operator (coming: issue 5).
