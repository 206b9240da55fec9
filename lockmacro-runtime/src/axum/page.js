// The locks page's own script (no framework): refreshes the table in place while the tab is
// visible (never sooner than 20 times the last listing took, so a page left open over a large
// keyspace keeps Redis busy at most 5% of the time), follows one key live over Server-Sent
// Events, and asks before a forced release.
// Everything it shows from a key or a holder goes in as text (textContent), never as markup;
// the table it swaps in is escaped by the server.
(() => {
  "use strict";
  const body = document.body;
  const base = body.dataset.base;
  const refreshMs = Number(body.dataset.refreshMs) || 3000;
  const locks = document.getElementById("locks");
  const status = document.getElementById("status");
  const updated = document.getElementById("updated");

  // What the status line says, and whether it is a failed refresh (cleared by the next good one).
  let refreshFailed = false;
  function say(text, isError) {
    refreshFailed = false;
    status.textContent = text;
    status.className = isError ? "error" : "";
  }

  // ---- The table and its counts, refreshed without a reload ----
  let timer = null;
  function failed(text) {
    say("Refreshing failed: " + text, true);
    refreshFailed = true;
  }
  async function refresh() {
    clearTimeout(timer);
    timer = null;
    if (document.visibilityState !== "visible") return;
    const url = base + "table?" + new URLSearchParams({ prefix: locks.dataset.prefix });
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (response.ok) {
        locks.innerHTML = await response.text();
        updated.textContent = "· updated " + new Date().toLocaleTimeString();
        if (refreshFailed) say("", false);
      } else {
        failed(response.status + " " + (await response.text()));
      }
    } catch (error) {
      failed(String(error));
    }
    schedule();
  }

  function schedule() {
    const counts = document.getElementById("counts");
    const tookMs = counts ? Number(counts.dataset.tookMs) || 0 : 0;
    clearTimeout(timer);
    timer = setTimeout(refresh, Math.max(refreshMs, 20 * tookMs));
  }

  // ---- The live view of one key ----
  const live = document.getElementById("live");
  const key = live && live.dataset.key;
  const events = document.getElementById("events");
  const liveState = document.getElementById("live-state");
  let source = null;

  function show(kind, text) {
    const line = document.createElement("li");
    line.className = kind;
    const time = document.createElement("time");
    time.textContent = new Date().toLocaleTimeString();
    line.append(time, " ", text);
    events.prepend(line);
    while (events.children.length > 50) events.lastChild.remove();
  }

  function follow() {
    if (!key || source) return;
    source = new EventSource(base + "events?" + new URLSearchParams({ key }));
    source.onopen = () => { liveState.textContent = "live"; };
    source.onerror = () => { liveState.textContent = "reconnecting…"; };
    source.addEventListener("acquired", (e) => {
      const taken = JSON.parse(e.data);
      show("acquired", "acquired by " + taken.holder + "…" + (taken.who ? " (" + taken.who + ")" : ""));
    });
    source.addEventListener("released", () => {
      show("released", "released (by its holder, expired or forced)");
    });
    source.addEventListener("trouble", (e) => show("trouble", "Redis: " + JSON.parse(e.data).error));
  }

  function unfollow() {
    if (!source) return;
    source.close();
    source = null;
    liveState.textContent = "paused while the tab is hidden";
  }

  // ---- Forced release: confirmation naming the holder, a POST carrying the page's token ----
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.release");
    if (!button) return;
    const { key: lockKey, holders, holderLabel } = button.dataset;
    const question = "Force-release " + lockKey + ", held by " + holderLabel +
      "?\n\nThe holder's work is cancelled (it gets Lost).";
    if (!window.confirm(question)) return;
    button.disabled = true;
    try {
      const response = await fetch(base + "release", {
        method: "POST",
        credentials: "same-origin",
        body: new URLSearchParams({ key: lockKey, holders, csrf: body.dataset.csrf }),
      });
      say(await response.text(), !response.ok);
    } catch (error) {
      say("Release failed: " + error, true);
    }
    refresh();
  });

  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") {
      follow();
      refresh();
    } else {
      unfollow();
    }
  });
  follow();
  schedule();
})();
