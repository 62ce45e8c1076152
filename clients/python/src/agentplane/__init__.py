"""Python client of agentplane: tool calls through the gateway, sessions
through the Kubernetes API, and tool definitions for the Anthropic API.

Standard library only (PyYAML only for ``Cluster.from_kubeconfig``)."""

from .anthropic_tools import anthropic_tools, policies
from .cluster import Cluster, describe_conditions, is_ready, spec_for_warm_pool
from .errors import (ApprovalRequired, Conflict, ConnectionFailed, Forbidden, GatewayError, Internal, Invalid,
                     NotFound, ProtocolError, ResponseTooLarge, SessionNotReady, StreamInterrupted,
                     StreamTimedOut, Timeout, TooManyRequests, Unauthenticated, Unavailable)
from .gateway import Gateway, SessionHandle, Tool, new_call_id
from .results import Approval, Chunk, ToolResult
from .stream import CallStream

__version__ = "0.1.0"

__all__ = [
    "Approval", "ApprovalRequired", "CallStream", "Chunk", "Cluster", "Conflict", "ConnectionFailed",
    "Forbidden", "Gateway", "GatewayError", "Internal", "Invalid", "NotFound", "ProtocolError",
    "ResponseTooLarge", "SessionHandle", "SessionNotReady", "StreamInterrupted", "StreamTimedOut", "Timeout",
    "Tool", "ToolResult", "TooManyRequests", "Unauthenticated", "Unavailable", "anthropic_tools",
    "describe_conditions", "is_ready", "new_call_id", "policies", "spec_for_warm_pool",
]
