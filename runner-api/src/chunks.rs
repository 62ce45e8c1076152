//! Received `Export`/`Import` chunks as a byte stream. The archive code is
//! synchronous and runs on a blocking thread; the chunks arrive on an async
//! stream, forwarded into a bounded channel (so a fast sender waits rather
//! than filling memory). Both the runner's `Import` and `kubectl agent cp`
//! read archives this way.

use std::io::Read;

use tokio::sync::mpsc::Receiver;

/// Reads the chunks of `rx` in order; an error item ends the stream with
/// that error, a closed channel with end of file.
#[derive(Debug)]
pub struct ChunkReader {
    rx: Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChunkReader {
    pub fn new(rx: Receiver<std::io::Result<Vec<u8>>>) -> Self {
        ChunkReader {
            rx,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ChunkReader {
    /// Blocks the calling thread: never call it on an async runtime's
    /// worker (tokio's `blocking_recv` panics there).
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(Ok(chunk)) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_read_in_order_across_reads_of_any_size_and_an_error_ends_them() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.blocking_send(Ok(b"hel".to_vec())).expect("send");
        tx.blocking_send(Ok(Vec::new())).expect("send");
        tx.blocking_send(Ok(b"lo".to_vec())).expect("send");
        drop(tx);
        let mut out = String::new();
        ChunkReader::new(rx).read_to_string(&mut out).expect("read");
        assert_eq!(out, "hello");

        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.blocking_send(Ok(b"a".to_vec())).expect("send");
        tx.blocking_send(Err(std::io::Error::other("peer went away")))
            .expect("send");
        let mut out = Vec::new();
        let err = ChunkReader::new(rx)
            .read_to_end(&mut out)
            .expect_err("the error item");
        assert_eq!(err.to_string(), "peer went away");
        assert_eq!(out, b"a");
    }
}
