//! Accept-side repair of the HTTP/2 `:authority` that gRPC clients send over
//! a Unix socket.
//!
//! Stock gRPC clients put the socket path in `:authority` when their target
//! is a Unix socket: grpc-core (Python `grpcio`, C++, Ruby, PHP) with
//! `unix:///run/x.sock` sends it percent-encoded without its leading slash
//! (`run%2Fx.sock`), grpc-java with a domain socket and older grpc-go send
//! the path itself. The HTTP/2 library under tonic (`h2`) parses
//! `:authority` as a URI authority while it decodes the request headers --
//! before hyper, tonic or any tower layer sees the request -- and `http`'s
//! parser refuses both (a `%` outside userinfo, a `/`), so h2 answers every
//! call with `RST_STREAM PROTOCOL_ERROR` unless the client overrides the
//! authority. h2 has no option to relax this.
//!
//! [`AuthorityFix`] wraps each accepted connection and reads the client's
//! byte stream one HTTP/2 frame at a time. Frames other than HEADERS and
//! CONTINUATION go through untouched (their payload is streamed, never
//! buffered). Each header block is HPACK-decoded with a decoder of our own
//! that follows the client's dynamic table; while every `:authority` is a
//! valid URI authority the block is handed on byte for byte. The first block
//! with one that is not (the socket path, an empty value) is re-encoded with
//! `:authority: localhost` -- what grpc-go and the Kubernetes clients send
//! for Unix sockets -- and from then on every block of that connection is
//! re-encoded, as literals that never enter h2's dynamic table, so h2's table
//! can never disagree with the client's. The server ignores `:authority`
//! otherwise, so nothing of the call changes.
//!
//! Anything that is not a well-formed HTTP/2 client stream (no preface, a
//! frame over the server's maximum size, CONTINUATION out of place, an HPACK
//! block our decoder rejects) switches the connection to plain pass-through,
//! so h2 sees exactly what the client sent and answers as it always does.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The server's SETTINGS_MAX_FRAME_SIZE: h2's default, which the runner's
/// tonic server keeps. A larger frame is refused by h2 anyway.
const MAX_FRAME: usize = 16_384;
/// A header block spread over CONTINUATION frames is buffered up to this
/// size; past it the connection is passed through for h2 to judge.
const MAX_BLOCK: usize = 1 << 20;
/// The HPACK dynamic table limit the client may use: h2's default
/// SETTINGS_HEADER_TABLE_SIZE, which the runner keeps.
const MAX_TABLE: usize = 4096;
/// Written instead of an authority that is not one.
const REPLACEMENT: &[u8] = b"localhost";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// An accepted connection whose request headers are repaired on the way in.
pub struct AuthorityFix<S> {
    inner: S,
    state: Box<State>,
}

impl<S> std::fmt::Debug for AuthorityFix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix")
            .field("phase", &self.state.phase)
            .field("rewriting", &self.state.rewriting)
            .finish_non_exhaustive()
    }
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            state: Box::new(State::new()),
        }
    }

    /// Whether a header block of this connection has been re-encoded.
    pub fn rewriting(&self) -> bool {
        self.state.rewriting
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Still matching the 24-byte client preface.
    Preface,
    /// Reading frames.
    Frames,
    /// Not (or no longer) a stream we understand: bytes go through as read.
    Passthrough,
}

/// A header block whose END_HEADERS has not arrived yet.
struct Pending {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    /// The frames exactly as received, for pass-through.
    raw: Vec<u8>,
    /// The HPACK fragments, concatenated.
    fragment: Vec<u8>,
}

struct State {
    phase: Phase,
    /// Bytes read from the client and not yet processed.
    raw: Vec<u8>,
    /// Processed bytes not yet handed to the server.
    out: Vec<u8>,
    out_pos: usize,
    /// Payload bytes of the current non-header frame still to pass through.
    passing: usize,
    pending: Option<Pending>,
    decoder: loona_hpack::Decoder<'static>,
    /// Set once a block was re-encoded: every later block is too.
    rewriting: bool,
    /// The re-encoded block being built (kept for its capacity).
    encoded: Vec<u8>,
    scratch: Box<[u8; MAX_FRAME]>,
    eof: bool,
}

impl State {
    fn new() -> State {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        State {
            phase: Phase::Preface,
            raw: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            passing: 0,
            pending: None,
            decoder,
            rewriting: false,
            encoded: Vec::new(),
            scratch: Box::new([0; MAX_FRAME]),
            eof: false,
        }
    }

    /// Moves everything still held to the output and stops interpreting.
    fn give_up(&mut self) {
        if let Some(p) = self.pending.take() {
            self.out.extend_from_slice(&p.raw);
        }
        self.out.append(&mut self.raw);
        self.phase = Phase::Passthrough;
    }

    /// Turns as much of `raw` into `out` as can be decided now.
    fn process(&mut self) {
        loop {
            match self.phase {
                Phase::Passthrough => {
                    self.out.append(&mut self.raw);
                    return;
                }
                Phase::Preface => {
                    let n = self.raw.len().min(PREFACE.len());
                    if self.raw[..n] != PREFACE[..n] {
                        self.give_up();
                        return;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    self.out.extend_from_slice(PREFACE);
                    self.raw.drain(..PREFACE.len());
                    self.phase = Phase::Frames;
                }
                Phase::Frames => {
                    if self.passing > 0 {
                        let n = self.passing.min(self.raw.len());
                        self.out.extend_from_slice(&self.raw[..n]);
                        self.raw.drain(..n);
                        self.passing -= n;
                        if self.passing > 0 {
                            return;
                        }
                    }
                    if self.raw.len() < 9 {
                        return;
                    }
                    let len =
                        u32::from_be_bytes([0, self.raw[0], self.raw[1], self.raw[2]]) as usize;
                    let kind = self.raw[3];
                    if kind != HEADERS && kind != CONTINUATION {
                        if self.pending.is_some() {
                            // Only CONTINUATION may follow an unfinished block.
                            self.give_up();
                            return;
                        }
                        self.out.extend_from_slice(&self.raw[..9]);
                        self.raw.drain(..9);
                        self.passing = len;
                        continue;
                    }
                    if len > MAX_FRAME {
                        self.give_up();
                        return;
                    }
                    if self.raw.len() < 9 + len {
                        return;
                    }
                    let frame: Vec<u8> = self.raw.drain(..9 + len).collect();
                    if !self.header_frame(&frame) {
                        self.give_up();
                        return;
                    }
                }
            }
        }
    }

    /// Takes one HEADERS or CONTINUATION frame; false if it does not fit the
    /// protocol, after writing it (and the unfinished block before it) as
    /// received: the caller passes everything after it through.
    fn header_frame(&mut self, frame: &[u8]) -> bool {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[9..];
        let mut block = match (kind, self.pending.take()) {
            (HEADERS, None) => {
                let mut at = 0;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let Some(&p) = payload.first() else {
                        self.out.extend_from_slice(frame);
                        return false;
                    };
                    pad = p as usize;
                    at = 1;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let Some(p) = payload.get(at..at + 5) else {
                        self.out.extend_from_slice(frame);
                        return false;
                    };
                    priority = Some([p[0], p[1], p[2], p[3], p[4]]);
                    at += 5;
                }
                if at + pad > payload.len() {
                    self.out.extend_from_slice(frame);
                    return false;
                }
                Pending {
                    stream,
                    end_stream: flags & END_STREAM != 0,
                    priority,
                    raw: frame.to_vec(),
                    fragment: payload[at..payload.len() - pad].to_vec(),
                }
            }
            (CONTINUATION, Some(mut p)) if p.stream == stream => {
                if p.raw.len() + frame.len() > MAX_BLOCK {
                    self.out.extend_from_slice(&p.raw);
                    self.out.extend_from_slice(frame);
                    return false;
                }
                p.raw.extend_from_slice(frame);
                p.fragment.extend_from_slice(payload);
                p
            }
            (_, Some(p)) => {
                self.out.extend_from_slice(&p.raw);
                self.out.extend_from_slice(frame);
                return false;
            }
            (_, None) => {
                self.out.extend_from_slice(frame);
                return false;
            }
        };
        if flags & END_HEADERS == 0 {
            self.pending = Some(block);
            return true;
        }
        self.finish_block(&mut block)
    }

    /// Decodes a complete header block and writes it, as received or
    /// re-encoded.
    fn finish_block(&mut self, block: &mut Pending) -> bool {
        let mut encoded = std::mem::take(&mut self.encoded);
        encoded.clear();
        let mut bad = false;
        let res = self.decoder.decode_with_cb(&block.fragment, |name, value| {
            let mut value: &[u8] = &value;
            if &*name == b":authority" && http::uri::Authority::try_from(value).is_err() {
                bad = true;
                value = REPLACEMENT;
            }
            literal(&mut encoded, &name, value);
        });
        if res.is_err() {
            // Our decoder and the client disagree: let h2 see the original.
            self.encoded = encoded;
            self.out.extend_from_slice(&block.raw);
            return false;
        }
        if bad && !self.rewriting {
            tracing::debug!(
                "a client sent an :authority that is not a URI authority (a socket path?); \
                 replacing it with localhost on this connection"
            );
            self.rewriting = true;
        }
        if self.rewriting {
            write_block(&mut self.out, block, &encoded);
        } else {
            self.out.extend_from_slice(&block.raw);
        }
        self.encoded = encoded;
        true
    }
}

/// Appends one "literal header field without indexing -- new name" (RFC
/// 7541, 6.2.2), strings not Huffman-coded: it never touches the server's
/// dynamic table.
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0);
    for s in [name, value] {
        // Writing to a Vec cannot fail.
        let _ = loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// Writes a header block as a HEADERS frame and as many CONTINUATION frames
/// as the server's frame size needs, keeping END_STREAM and the priority.
fn write_block(out: &mut Vec<u8>, block: &Pending, encoded: &[u8]) {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first = encoded.len().min(MAX_FRAME - prio_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if first == encoded.len() {
        flags |= END_HEADERS;
    }
    frame_header(out, first + prio_len, HEADERS, flags, block.stream);
    if let Some(p) = block.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(&encoded[..first]);
    let mut rest = &encoded[first..];
    while !rest.is_empty() {
        let n = rest.len().min(MAX_FRAME);
        let flags = if n == rest.len() { END_HEADERS } else { 0 };
        frame_header(out, n, CONTINUATION, flags, block.stream);
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
}

fn frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let st = &mut *this.state;
            if st.out_pos < st.out.len() {
                let n = buf.remaining().min(st.out.len() - st.out_pos);
                buf.put_slice(&st.out[st.out_pos..st.out_pos + n]);
                st.out_pos += n;
                if st.out_pos == st.out.len() {
                    st.out.clear();
                    st.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if st.eof {
                return Poll::Ready(Ok(()));
            }
            if st.phase == Phase::Passthrough && st.raw.is_empty() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut rb = ReadBuf::new(&mut st.scratch[..]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let filled = rb.filled();
            if filled.is_empty() {
                // The client closed its side: hand on whatever is held.
                st.eof = true;
                st.give_up();
                continue;
            }
            st.raw.extend_from_slice(filled);
            st.process();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    /// Literal with incremental indexing, name from the static table
    /// (`:authority` is static index 1), value not Huffman-coded (the
    /// interop tests cover grpc-core's own encoding).
    fn indexed_name_literal(index: u8, value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40 | index];
        loona_hpack::encoder::encode_integer_into(value.len(), 7, 0, &mut out).unwrap();
        out.extend_from_slice(value);
        out
    }

    /// A request header block as grpc-core writes its first one: indexed
    /// `:method POST` and `:scheme http`, the rest literals that enter the
    /// dynamic table.
    fn first_block(authority: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        b.extend(indexed_name_literal(4, b"/agentplane.runner.v1.Runner/Run"));
        b.extend(indexed_name_literal(1, authority));
        b.extend(indexed_name_literal(31, b"application/grpc")); // content-type
        b
    }

    async fn through(input: Vec<u8>) -> (Vec<u8>, bool) {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut fix = AuthorityFix::new(server);
        client.write_all(&input).await.unwrap();
        client.shutdown().await.unwrap();
        let mut out = Vec::new();
        fix.read_to_end(&mut out).await.unwrap();
        (out, fix.rewriting())
    }

    /// Decodes every header block of a client stream as h2 would.
    fn decode_stream(bytes: &[u8]) -> Vec<Vec<(String, String)>> {
        assert!(bytes.starts_with(PREFACE));
        let mut rest = &bytes[PREFACE.len()..];
        let mut dec = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        while !rest.is_empty() {
            let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let (kind, flags) = (rest[3], rest[4]);
            let payload = &rest[9..9 + len];
            if kind == HEADERS || kind == CONTINUATION {
                let mut at = 0;
                let mut pad = 0;
                if kind == HEADERS && flags & PADDED != 0 {
                    pad = payload[0] as usize;
                    at = 1;
                }
                if kind == HEADERS && flags & PRIORITY != 0 {
                    at += 5;
                }
                pending.extend_from_slice(&payload[at..payload.len() - pad]);
                if flags & END_HEADERS != 0 {
                    let h = dec.decode(&pending).unwrap();
                    blocks.push(
                        h.into_iter()
                            .map(|(n, v)| {
                                (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                            })
                            .collect(),
                    );
                    pending.clear();
                }
            }
            rest = &rest[9 + len..];
        }
        blocks
    }

    fn authority(block: &[(String, String)]) -> &str {
        &block.iter().find(|(n, _)| n == ":authority").unwrap().1
    }

    #[tokio::test]
    async fn valid_authority_passes_byte_for_byte() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &first_block(b"127.0.0.1:7000"),
        ));
        input.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 1, 7])); // DATA
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            3,
            &[0x83, 0x86, 0xc0, 0xbf, 0xbe],
        ));
        let (out, rewriting) = through(input.clone()).await;
        assert_eq!(out, input);
        assert!(!rewriting);
    }

    #[tokio::test]
    async fn socket_path_becomes_localhost_and_the_table_stays_in_step() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0xff, 0xff])); // SETTINGS
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &first_block(b"/tmp/run_3/runner.sock"),
        ));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02hi"));
        // The next call refers to the dynamic table: :path, :authority and
        // content-type inserted by the first block (62, 63, 64 newest first).
        let second = [0x83, 0x86, 0xc0, 0xbf, 0xbe];
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));
        let (out, rewriting) = through(input).await;
        assert!(rewriting);
        let blocks = decode_stream(&out);
        assert_eq!(blocks.len(), 2);
        for b in &blocks {
            assert_eq!(authority(b), "localhost");
            assert!(b.contains(&(":path".into(), "/agentplane.runner.v1.Runner/Run".into())));
            assert!(b.contains(&("content-type".into(), "application/grpc".into())));
            assert!(b.contains(&(":method".into(), "POST".into())));
        }
        // The DATA frame and the flags are unchanged.
        assert!(
            out.windows(16)
                .any(|w| w == frame(0x0, END_STREAM, 1, b"\0\0\0\0\x02hi"))
        );
    }

    #[tokio::test]
    async fn continuation_padding_priority_and_empty_authority() {
        let block = first_block(b"");
        let (a, b) = block.split_at(7);
        let mut headers = vec![3]; // pad length
        headers.extend_from_slice(&[0x80, 0, 0, 0, 16]); // exclusive dep 0, weight
        headers.extend_from_slice(a);
        headers.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, PADDED | PRIORITY | END_STREAM, 5, &headers));
        input.extend(frame(CONTINUATION, END_HEADERS, 5, b));
        let (out, rewriting) = through(input).await;
        assert!(rewriting);
        let blocks = decode_stream(&out);
        assert_eq!(authority(&blocks[0]), "localhost");
        let flags = out[PREFACE.len() + 4];
        assert_eq!(flags, PRIORITY | END_STREAM | END_HEADERS);
        assert_eq!(
            &out[PREFACE.len() + 9..PREFACE.len() + 14],
            &[0x80, 0, 0, 0, 16]
        );
    }

    #[tokio::test]
    async fn a_big_block_is_split_at_the_frame_size() {
        let mut block = first_block(b"/s");
        let big = "x".repeat(40_000);
        literal(&mut block, b"x-big", big.as_bytes());
        let mut input = PREFACE.to_vec();
        // As the client would send it: HEADERS and CONTINUATIONs.
        let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
        for (i, c) in chunks.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == chunks.len() {
                END_HEADERS
            } else {
                0
            };
            input.extend(frame(kind, flags, 1, c));
        }
        let (out, _) = through(input).await;
        let blocks = decode_stream(&out);
        assert_eq!(authority(&blocks[0]), "localhost");
        assert!(blocks[0].contains(&("x-big".into(), big)));
    }

    #[tokio::test]
    async fn not_http2_passes_through() {
        let input = b"GET / HTTP/1.1\r\nHost: /tmp/x.sock\r\n\r\n".to_vec();
        let (out, rewriting) = through(input.clone()).await;
        assert_eq!(out, input);
        assert!(!rewriting);
    }

    #[tokio::test]
    async fn garbage_hpack_passes_through_unchanged() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        input.extend(frame(0x0, END_STREAM, 1, b"abc"));
        let (out, rewriting) = through(input.clone()).await;
        assert_eq!(out, input);
        assert!(!rewriting);
    }

    #[tokio::test]
    async fn arrives_one_byte_at_a_time() {
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &first_block(b"/a/b.sock")));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0"));
        let (mut client, server) = tokio::io::duplex(1);
        let mut fix = AuthorityFix::new(server);
        let writer = tokio::spawn(async move {
            for b in input {
                client.write_all(&[b]).await.unwrap();
            }
            client.shutdown().await.unwrap();
        });
        let mut out = Vec::new();
        fix.read_to_end(&mut out).await.unwrap();
        writer.await.unwrap();
        let blocks = decode_stream(&out);
        assert_eq!(authority(&blocks[0]), "localhost");
        assert!(out.ends_with(&frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")));
    }
}
