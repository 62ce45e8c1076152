//! Server-sent events, parsed from bytes as they arrive, bounded: an event
//! larger than the limit is an error rather than a growing buffer (a tool
//! call's input can be large, but not unbounded).

/// One event's `event:` name and joined `data:` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, empty when absent.
    pub event: String,
    /// The `data:` lines joined by newlines.
    pub data: String,
}

/// An event grew past the parser's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge(pub usize);

/// Incremental parser: feed it chunks, take whole events.
#[derive(Debug)]
pub struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    limit: usize,
}

impl SseParser {
    /// A parser that refuses any event (with its pending line) over `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            event: String::new(),
            data: String::new(),
            has_data: false,
            limit,
        }
    }

    /// Adds bytes; returns the events they completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, TooLarge> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
        }
        self.buf.drain(..start);
        if self.buf.len() + self.data.len() > self.limit {
            return Err(TooLarge(self.limit));
        }
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            if !self.has_data {
                self.event.clear();
                return None;
            }
            let ev = SseEvent {
                event: std::mem::take(&mut self.event),
                data: std::mem::take(&mut self.data),
            };
            self.has_data = false;
            return Some(ev);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_come_out_whole() {
        let mut p = SseParser::new(1 << 20);
        assert!(p.feed(b"event: message\r\nda").unwrap().is_empty());
        let evs = p
            .feed(b"ta: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\n")
            .unwrap();
        assert_eq!(
            evs,
            vec![
                SseEvent {
                    event: "message".into(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: String::new(),
                    data: "x\ny".into()
                }
            ]
        );
    }

    #[test]
    fn an_event_past_the_limit_is_refused_not_buffered() {
        let mut p = SseParser::new(64);
        let big = vec![b'a'; 100];
        assert_eq!(p.feed(&big), Err(TooLarge(64)));
        let mut p = SseParser::new(64);
        let mut line = b"data: ".to_vec();
        line.extend_from_slice(&[b'b'; 40]);
        line.push(b'\n');
        assert!(p.feed(&line).is_ok());
        assert_eq!(p.feed(&line), Err(TooLarge(64)));
    }
}
