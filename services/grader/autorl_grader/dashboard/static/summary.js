// The agent summary page: polls /ui/api/summary and redraws its table. Task, agent and model names
// come from experiments (an agent may be named after its own folder): they are only ever set as
// text (textContent), never parsed as HTML.
"use strict";

(function () {
  const POLL_MS = 2000;

  const score = (value) => (value === null ? "–" : value.toFixed(2));
  const change = (value) => (value === null ? "–" : (value >= 0 ? "+" : "") + value.toFixed(2));
  const trend = (value) => (value === null || value === 0 ? "" : value > 0 ? " up" : " down");

  function groupRow(group) {
    const tr = document.createElement("tr");
    const cells = [
      [group.task, ""],
      [group.agent, ""],
      [group.model, "path"],
      [group.feedback, ""],
      [String(group.runs), "num"],
      [String(group.succeeded), "num"],
      [score(group.baseline), "num"],
      [score(group.best_score), "num"],
      [score(group.mean_best_score), "num"],
      [change(group.best_improvement), "num" + trend(group.best_improvement)],
      [change(group.mean_improvement), "num" + trend(group.mean_improvement)],
      [String(group.submissions), "num"],
    ];
    for (const [text, className] of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      if (className) td.className = className;
      tr.appendChild(td);
    }
    return tr;
  }

  async function refresh() {
    const response = await fetch("/ui/api/summary", { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) {
      window.location.assign("/ui/login");
      return;
    }
    if (!response.ok) throw new Error(response.statusText);
    const data = await response.json();
    const body = document.querySelector("#summary tbody");
    body.replaceChildren(...data.groups.map(groupRow));
    document.getElementById("empty").hidden = data.groups.length > 0;
    window.autorlPolls = (window.autorlPolls || 0) + 1;
  }

  async function tick() {
    const status = document.getElementById("updated");
    try {
      await refresh();
      status.textContent = "updated " + new Date().toLocaleTimeString();
      status.classList.remove("down");
    } catch (error) {
      status.textContent = "update failed: " + (error.message || error);
      status.classList.add("down");
    } finally {
      window.setTimeout(tick, POLL_MS);
    }
  }

  tick();
})();
