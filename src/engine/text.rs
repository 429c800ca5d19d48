//! A request's output text: token pieces (bytes) to complete UTF-8, with
//! stop strings matched across token boundaries.
//!
//! Text is released only when it is complete UTF-8 and cannot be the start
//! of a stop string; a match cuts the text before it.

use crate::model::tokenizer::take_complete_utf8;

/// The unreleased tail of one request's output.
#[derive(Debug, Clone, Default)]
pub(crate) struct TextStream {
    /// Bytes of an incomplete UTF-8 character.
    bytes: Vec<u8>,
    /// Decoded text not released yet.
    held: String,
    /// Stop strings (non-empty ones only).
    stops: Vec<String>,
    /// A stop string matched: nothing more is released.
    stopped: bool,
}

impl TextStream {
    /// A stream that stops at any of `stops` (empty strings are ignored).
    pub(crate) fn new(stops: &[String]) -> Self {
        TextStream {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    /// Adds one token's bytes; returns whether a stop string now matched
    /// (the held text is then cut before it).
    pub(crate) fn push(&mut self, piece: &[u8]) -> bool {
        if self.stopped {
            return true;
        }
        self.bytes.extend_from_slice(piece);
        take_complete_utf8(&mut self.bytes, &mut self.held, false);
        // Released text never holds a stop string's start, so a match lies
        // wholly inside the held text.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.held.truncate(at);
            self.bytes.clear();
            self.stopped = true;
        }
        self.stopped
    }

    /// Whether a stop string matched.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// Text that can be released now: all held text but the longest suffix
    /// that is a proper prefix of a stop string.
    pub(crate) fn take_ready(&mut self) -> String {
        if self.stopped {
            return std::mem::take(&mut self.held);
        }
        let keep = self.partial_stop_len();
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// Releases everything at the end of the request (an incomplete
    /// character comes out as U+FFFD).
    pub(crate) fn finish(&mut self) -> String {
        if !self.stopped {
            take_complete_utf8(&mut self.bytes, &mut self.held, true);
        }
        self.bytes.clear();
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that a stop string
    /// starts with (a char boundary by construction).
    fn partial_stop_len(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(held.len());
            for k in (best + 1..=max).rev() {
                let from = held.len() - k;
                if held.is_char_boundary(from) && stop.starts_with(&held[from..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut t = TextStream::new(&stops);
        let mut out = Vec::new();
        let mut stopped = false;
        for p in pieces {
            stopped = t.push(p);
            out.push(t.take_ready());
            if stopped {
                break;
            }
        }
        (out, stopped, t.finish())
    }

    #[test]
    fn utf8_split_across_pieces_is_released_whole() {
        let euro = "€".as_bytes();
        let (out, stopped, tail) = run(&[], &[b"a", &euro[..1], &euro[1..2], &euro[2..], b"b"]);
        assert_eq!(out, ["a", "", "", "€", "b"]);
        assert!(!stopped);
        assert_eq!(tail, "");
    }

    #[test]
    fn invalid_and_truncated_bytes_become_replacement_characters() {
        let (out, _, tail) = run(&[], &[b"x\xff", &"€".as_bytes()[..2]]);
        assert_eq!(out, ["x\u{FFFD}", ""]);
        assert_eq!(tail, "\u{FFFD}");
    }

    #[test]
    fn stop_string_across_pieces_cuts_before_it() {
        let (out, stopped, tail) = run(&["END"], &[b"ab", b"cE", b"N", b"Dzz"]);
        assert_eq!(out, ["ab", "c", "", ""]);
        assert!(stopped);
        assert_eq!(tail, "");
    }

    #[test]
    fn false_start_is_released_once_it_diverges() {
        let (out, stopped, tail) = run(&["END"], &[b"aE", b"Nx", b"E"]);
        assert_eq!(out, ["a", "ENx", ""]);
        assert!(!stopped);
        assert_eq!(tail, "E");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["world", "lo w"], &[b"hello world"]);
        assert_eq!(out, ["hel"]);
        assert!(stopped);
    }
}
