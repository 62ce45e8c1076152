//! Binding the operator's listeners, with an error that names the address.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::error::{Error, Result};

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|source| Error::Bind {
        addr: addr.to_string(),
        source,
    })
}
