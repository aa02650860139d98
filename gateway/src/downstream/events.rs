//! Where events end in a body passed through, so that `/metrics` times a
//! passed-through stream event by event, as it times a numbered one and as
//! a client's SDK yields it, whatever the sizes of the reads.

/// Counts the events that end in each read of a streamed body: SSE blocks
/// with a field in them (a block of comments only is a keepalive, not an
/// event, as the numbering treats it), or NDJSON lines with something on
/// them. A line end or a block split across reads counts once, where it
/// ends.
#[derive(Debug)]
pub(crate) struct EventEnds {
    ndjson: bool,
    /// The last byte ended a line (or nothing was read yet).
    line_start: bool,
    /// The last byte was a `\r`: a `\n` next ends the same line.
    cr: bool,
    /// The block (SSE) or line (NDJSON) so far is an event's.
    content: bool,
}

impl EventEnds {
    /// A counter for an NDJSON body (`ndjson`) or an SSE one.
    pub(crate) fn new(ndjson: bool) -> Self {
        EventEnds {
            ndjson,
            line_start: true,
            cr: false,
            content: false,
        }
    }

    /// How many events end in `data`.
    pub(crate) fn count(&mut self, data: &[u8]) -> usize {
        let mut ends = 0;
        let mut i = 0;
        while i < data.len() {
            let stop = memchr::memchr2(b'\n', b'\r', &data[i..]).map_or(data.len(), |k| i + k);
            if stop > i {
                // A line's first byte says what it is: a comment (`:`) in
                // SSE, anything in NDJSON.
                if self.line_start && (self.ndjson || data[i] != b':') {
                    self.content = true;
                }
                self.line_start = false;
                self.cr = false;
                i = stop;
                continue;
            }
            let b = data[i];
            i += 1;
            if b == b'\n' && self.cr {
                self.cr = false;
                continue;
            }
            self.cr = b == b'\r';
            // A line ended: in NDJSON an event; in SSE a blank line ends
            // the block.
            if (self.ndjson || self.line_start) && self.content {
                ends += 1;
                self.content = false;
            }
            self.line_start = true;
        }
        ends
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_everywhere(ndjson: bool, body: &[u8]) -> Vec<usize> {
        (0..=body.len())
            .map(|at| {
                let mut e = EventEnds::new(ndjson);
                e.count(&body[..at]) + e.count(&body[at..])
            })
            .collect()
    }

    #[test]
    fn sse_events_end_at_blank_lines_whatever_the_line_ends_and_reads() {
        let body = b"data: a\n\nevent: e\r\ndata: b\r\n\r\n: keepalive\n\ndata: c\rdata: d\r\r";
        let mut e = EventEnds::new(false);
        assert_eq!(e.count(body), 3, "the comment block is no event");
        assert!(
            split_everywhere(false, body).iter().all(|&n| n == 3),
            "{:?}",
            split_everywhere(false, body)
        );
        let mut one_by_one = EventEnds::new(false);
        let n: usize = body.iter().map(|b| one_by_one.count(&[*b])).sum();
        assert_eq!(n, 3);
    }

    #[test]
    fn an_sse_event_counts_where_it_ends() {
        let mut e = EventEnds::new(false);
        assert_eq!(e.count(b"data: {\"a\":"), 0);
        assert_eq!(e.count(b"1}\n"), 0);
        assert_eq!(e.count(b"\n"), 1);
        assert_eq!(e.count(b"\n\n"), 0, "blank lines alone end nothing");
    }

    #[test]
    fn ndjson_events_are_lines_with_something_on_them() {
        let body = b"{\"a\":1}\n{\"b\":2}\r\n\n{\"done\":true}\n";
        assert!(split_everywhere(true, body).iter().all(|&n| n == 3));
        let mut e = EventEnds::new(true);
        assert_eq!(e.count(b"{\"partial\":"), 0);
        assert_eq!(e.count(b"1}"), 0);
        assert_eq!(e.count(b"\n"), 1);
    }
}
