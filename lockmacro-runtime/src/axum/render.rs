//! The locks page as HTML: the document, the table it refreshes in place, one holder. Every
//! key, holder and message goes through [`html`]; links inside the page are query-only
//! (`?watch=…`), so they resolve against the page wherever it is mounted.

use std::fmt::Write;
use std::time::Duration;

use super::escape::{html, query_value};
use crate::{Holder, LockInfo, LockKind, Waiter};

/// What one listing found (see `Page::list`).
#[derive(Default)]
pub(crate) struct Listing {
    /// The first locks found, at most the page's limit.
    pub(crate) locks: Vec<LockInfo>,
    /// Every lock the scan found, listed or not: all of them, unless it stopped early.
    pub(crate) counted: Counts,
    /// The listing's time budget ran out before the scan ended.
    pub(crate) cut_short: bool,
    /// Why listing stopped early, when Redis failed.
    pub(crate) error: Option<String>,
    /// How long the listing took, which the page's script spaces its refreshes by.
    pub(crate) took: Duration,
}

/// What a listing counted: locks, their holders, and the callers waiting for them.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) locks: usize,
    pub(crate) holders: usize,
    pub(crate) waiters: usize,
}

impl Counts {
    pub(crate) fn add(&mut self, lock: &LockInfo) {
        self.locks += 1;
        self.holders += lock.holders().len();
        self.waiters += lock.waiters();
    }
}

impl Listing {
    /// The scan stopped before its end (its budget, or Redis failed): the counts are a floor.
    fn stopped_early(&self) -> bool {
        self.cut_short || self.error.is_some()
    }
}

/// What the table shows besides the locks.
pub(crate) struct TableView<'a> {
    /// The prefix the list is filtered by (`""`: every lock in the page's scope).
    pub(crate) prefix: &'a str,
    pub(crate) budget: Duration,
    pub(crate) force_release: bool,
}

/// What the document shows around the table.
pub(crate) struct PageView<'a> {
    /// Where the page's own routes are, relative to the page (`"locks/"` for a page at
    /// `/admin/locks`, `""` for one at `/admin/locks/`).
    pub(crate) base: &'a str,
    pub(crate) table: TableView<'a>,
    /// The key followed live, when one is: `Ok` when in the page's scope.
    pub(crate) watch: Option<Result<&'a str, &'a str>>,
    /// The forced-release token, when forced release is enabled.
    pub(crate) csrf: Option<&'a str>,
    pub(crate) refresh: Duration,
    /// The prefixes the page is limited to (empty: every lock).
    pub(crate) scope: &'a [String],
}

/// The whole page.
pub(crate) fn page(view: &PageView<'_>, listing: &Listing) -> String {
    let base = html(view.base);
    let prefix = html(view.table.prefix);
    let mut out = String::with_capacity(8 * 1024);
    let _ = write!(
        out,
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Locks</title>
<link rel="stylesheet" href="{base}page.css">
<script src="{base}page.js" defer></script>
</head>
<body data-base="{base}" data-refresh-ms="{refresh}"{csrf}>
<header>
<h1>Locks</h1>
<form id="filter" method="get">
<label>Prefix <input name="prefix" value="{prefix}" placeholder="every lock" size="24"></label>
{watch_input}<button type="submit">Filter</button>
</form>
<p class="scope">{scope} · {mode} · refreshed every {every} <span id="updated"></span></p>
</header>
<main>
<section id="locks" data-prefix="{prefix}">
{table}</section>
{live}
<p id="status" role="status"></p>
</main>
</body>
</html>
"#,
        refresh = view.refresh.as_millis(),
        csrf = view
            .csrf
            .map(|token| format!(r#" data-csrf="{}""#, html(token)))
            .unwrap_or_default(),
        watch_input = match view.watch {
            Some(Ok(key)) => format!(
                r#"<input type="hidden" name="watch" value="{}">"#,
                html(key)
            ),
            _ => String::new(),
        },
        scope = scope(view.scope),
        mode = if view.table.force_release {
            "forced release enabled"
        } else {
            "read-only"
        },
        every = duration(view.refresh),
        table = table(&view.table, listing),
        live = live(view),
    );
    out
}

fn scope(prefixes: &[String]) -> String {
    if prefixes.is_empty() {
        return "every lock".to_owned();
    }
    let names: Vec<String> = prefixes
        .iter()
        .map(|prefix| format!("<code>{}:</code>", html(prefix)))
        .collect();
    format!("locks under {}", names.join(", "))
}

/// The live view of one key: its events arrive through the page's script.
fn live(view: &PageView<'_>) -> String {
    let close = format!("?prefix={}", query_value(view.table.prefix));
    match view.watch {
        None => r#"<p class="hint">Click a key to follow it live.</p>"#.to_owned(),
        Some(Err(reason)) => format!(
            r#"<section id="live"><p class="error">{}</p><a href="{}">close</a></section>"#,
            html(reason),
            html(&close)
        ),
        Some(Ok(key)) => format!(
            r#"<section id="live" data-key="{key}">
<h2>Live: <code>{key}</code> <span id="live-state">connecting…</span> <a href="{close}">close</a></h2>
<ol id="events"></ol>
</section>"#,
            key = html(key),
            close = html(&close),
        ),
    }
}

/// The table with its counts: the part the page's script refreshes in place. The counts are
/// of every lock the scan found, not only those listed; "at least" when it stopped early.
pub(crate) fn table(view: &TableView<'_>, listing: &Listing) -> String {
    let Counts {
        locks,
        holders,
        waiters,
    } = listing.counted;
    let at_least = if listing.stopped_early() {
        "at least "
    } else {
        ""
    };
    let mut out = String::with_capacity(1024 + listing.locks.len() * 512);
    let _ = writeln!(
        out,
        r#"<p id="counts" data-took-ms="{took}">{at_least}<b id="count-locks">{locks}</b> {locks_word} held · {at_least}<b id="count-holders">{holders}</b> {holders_word} · {at_least}<b id="count-waiters">{waiters}</b> waiting</p>"#,
        took = listing.took.as_millis(),
        locks_word = plural(locks, "lock", "locks"),
        holders_word = plural(holders, "holder", "holders"),
    );
    if let Some(error) = &listing.error {
        let _ = writeln!(
            out,
            r#"<p class="error">Listing stopped: {}</p>"#,
            html(error)
        );
    }
    if locks > listing.locks.len() {
        let _ = writeln!(
            out,
            r#"<p class="note" id="truncated">Showing the first {} of {at_least}{locks} locks found; narrow the prefix to see the others.</p>"#,
            listing.locks.len(),
        );
    }
    if listing.cut_short {
        let _ = writeln!(
            out,
            r#"<p class="note" id="cut-short">The scan stopped after {}; narrow the prefix to see every lock under it.</p>"#,
            duration(view.budget)
        );
    }
    out.push_str(
        "<table>\n<thead><tr><th>Key</th><th>Kind</th><th>Holders</th><th>Time left</th><th>Fencing token</th><th>Waiters</th>",
    );
    if view.force_release {
        out.push_str("<th></th>");
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    if listing.locks.is_empty() {
        let under = if view.prefix.is_empty() {
            String::new()
        } else {
            format!(" under <code>{}:</code>", html(view.prefix))
        };
        let _ = writeln!(
            out,
            r#"<tr class="empty"><td colspan="7">No locks held{under}.</td></tr>"#
        );
    }
    for lock in &listing.locks {
        row(&mut out, view, lock);
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

fn row(out: &mut String, view: &TableView<'_>, lock: &LockInfo) {
    let key = html(lock.key());
    let watch = html(&format!(
        "?prefix={}&watch={}",
        query_value(view.prefix),
        query_value(lock.key())
    ));
    let holders: String = lock.holders().iter().map(holder).collect();
    let _ = write!(
        out,
        r#"<tr data-key="{key}"><td class="key"><a href="{watch}">{key}</a></td><td>{kind}</td><td><ul class="holders">{holders}</ul></td><td>{left}</td><td>{fencing}</td><td class="waiters"><b class="count">{waiters}</b>{next}</td>"#,
        kind = kind(lock.kind()),
        left = duration(lock.time_left()),
        fencing = lock
            .fencing_token()
            .map_or_else(|| "—".to_owned(), |token| token.to_string()),
        waiters = lock.waiters(),
        next = lock.reserved_for().map(next_waiter).unwrap_or_default(),
    );
    if view.force_release {
        let hints: Vec<&str> = lock.holders().iter().map(Holder::token_hint).collect();
        let labels: Vec<String> = lock.holders().iter().map(holder_label).collect();
        let _ = write!(
            out,
            r#"<td><button type="button" class="release" data-key="{key}" data-holders="{hints}" data-holder-label="{labels}">Force release</button></td>"#,
            hints = html(&hints.join(",")),
            labels = html(&labels.join("; ")),
        );
    }
    out.push_str("</tr>\n");
}

/// One holder in the Holders column: its token hint, who holds it and since when, and its
/// time left.
fn holder(holder: &Holder) -> String {
    let who = match identity(holder) {
        Some(who) => format!(r#" <span class="who">{}</span>"#, html(&who)),
        None => String::new(),
    };
    format!(
        r#"<li><code class="token">{}…</code>{who} <span class="left">{}</span></li>"#,
        html(holder.token_hint()),
        duration(holder.time_left())
    )
}

/// The caller the lock is reserved for, after the count of waiters: the one waiter whose
/// origin the lock's value keeps (the others are stored as bare tokens, so only counted).
fn next_waiter(waiter: &Waiter) -> String {
    let mut who = origin(waiter.app(), waiter.pid(), waiter.host()).unwrap_or_default();
    if let Ok(waited) = std::time::SystemTime::now().duration_since(waiter.waiting_since()) {
        let _ = write!(who, ", waiting {}", duration(waited));
    }
    format!(
        r#" <span class="next">next: <code class="token">{}…</code> <span class="who">{}</span></span>"#,
        html(waiter.token_hint()),
        html(&who)
    )
}

/// One holder in words, as the confirmation of a forced release names it.
pub(crate) fn holder_label(holder: &Holder) -> String {
    let who = identity(holder).map_or_else(String::new, |who| format!(", {who}"));
    format!(
        "token {}…{who} ({} left)",
        holder.token_hint(),
        duration(holder.time_left())
    )
}

/// Who holds it and since when (`billing (pid 4242) on web-3, for 3.2 s`), when its value says:
/// `None` for a lock an older version took.
pub(crate) fn identity(holder: &Holder) -> Option<String> {
    let mut who = origin(holder.app(), holder.pid(), holder.host())?;
    if let Some(held) = holder
        .acquired_at()
        .and_then(|at| std::time::SystemTime::now().duration_since(at).ok())
    {
        let _ = write!(who, ", for {}", duration(held));
    }
    Some(who)
}

/// `billing (pid 4242) on web-3`; `None` for a value of an older version, which names nobody.
fn origin(app: Option<&str>, pid: Option<u32>, host: Option<&str>) -> Option<String> {
    let mut who = app?.to_owned();
    if let Some(pid) = pid {
        let _ = write!(who, " (pid {pid})");
    }
    if let Some(host) = host {
        let _ = write!(who, " on {host}");
    }
    Some(who)
}

fn kind(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "exclusive".to_owned(),
        LockKind::Read => "read".to_owned(),
        LockKind::Permits(permits) => format!("{permits} permits"),
    }
}

/// `250 ms`, `2.9 s`, `4 m 05 s`, `1 h 02 m`: what an operator reads at a glance.
fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds == 0 {
        format!("{} ms", duration.as_millis())
    } else if seconds >= 3600 {
        format!("{} h {:02} m", seconds / 3600, seconds % 3600 / 60)
    } else if seconds >= 60 {
        format!("{} m {:02} s", seconds / 60, seconds % 60)
    } else if duration >= Duration::from_secs(10) {
        format!("{seconds} s")
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}

fn plural(count: usize, one: &'static str, many: &'static str) -> &'static str {
    if count == 1 { one } else { many }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::duration;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(duration(Duration::from_millis(2940)), "2.9 s");
        assert_eq!(duration(Duration::from_secs(42)), "42 s");
        assert_eq!(duration(Duration::from_secs(245)), "4 m 05 s");
        assert_eq!(duration(Duration::from_secs(3720)), "1 h 02 m");
    }
}
