//! A command's arguments as the simulated node reads them, and the replies it builds: what
//! `redis::Value` would hold had a real server sent them (RESP2, as the store speaks to Redis).

use ::redis::Value as Reply;

/// A command and its arguments, as sent.
#[derive(Debug, Clone)]
pub(crate) struct Args(Vec<Vec<u8>>);

impl Args {
    pub(crate) fn new(args: Vec<Vec<u8>>) -> Self {
        Self(args)
    }

    /// The command's name, upper-cased (`""` for an empty command).
    pub(crate) fn name(&self) -> String {
        self.upper(0)
    }

    /// How many there are, the name included.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The argument at `at` (the name is at 0); empty past the end.
    pub(crate) fn bytes(&self, at: usize) -> &[u8] {
        self.0.get(at).map_or(&[], Vec::as_slice)
    }

    /// The argument at `at`, upper-cased: an option's name.
    pub(crate) fn upper(&self, at: usize) -> String {
        String::from_utf8_lossy(self.bytes(at)).to_uppercase()
    }

    /// The argument at `at` as an integer, as Redis reads one (no sign `+`, no spaces).
    pub(crate) fn integer(&self, at: usize) -> Option<i64> {
        let text = std::str::from_utf8(self.bytes(at)).ok()?;
        if text.starts_with('+') {
            return None;
        }
        text.parse().ok()
    }

    /// The arguments from `at` on.
    pub(crate) fn from(&self, at: usize) -> &[Vec<u8>] {
        self.0.get(at..).unwrap_or(&[])
    }

    /// Ok when there are `n` of them, the name included.
    pub(crate) fn exactly(&self, n: usize) -> Result<(), String> {
        if self.len() == n {
            Ok(())
        } else {
            Err(arity(&self.name()))
        }
    }

    /// Ok when there are at least `n` of them, the name included.
    pub(crate) fn at_least(&self, n: usize) -> Result<(), String> {
        if self.len() >= n {
            Ok(())
        } else {
            Err(arity(&self.name()))
        }
    }
}

/// An error reply, `message` starting with its code (`ERR`, `WRONGTYPE`, `NOSCRIPT`, ...).
pub(crate) fn error(message: &str) -> Reply {
    // Through redis-rs's own parser: `ServerError` has no public constructor.
    let line: String = message
        .chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .collect();
    ::redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
        .unwrap_or_else(|_| Reply::SimpleString(line))
}

/// Redis's message for a command given too few or too many arguments.
pub(crate) fn arity(name: &str) -> String {
    format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_lowercase()
    )
}

/// The error for a command (or option) the simulated node does not know: loud, so that a script
/// or store using a new command fails here rather than being answered by a guess.
pub(crate) fn not_simulated(name: &str) -> String {
    format!("ERR unknown command '{name}': not implemented by the simulated Redis")
}

/// A number as a bulk string, as `TIME` and `SCAN` send their numbers.
pub(crate) fn bulk_number(n: u64) -> Reply {
    Reply::BulkString(n.to_string().into_bytes())
}
