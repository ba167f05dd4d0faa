// The dashboard's pages poll the grader's read-only JSON and redraw in place (no reload).
// Everything that comes from an experiment (names, paths, errors, the agent's log) is untrusted:
// it is only ever set as text (textContent), never parsed as HTML.
"use strict";

(function () {
  const POLL_MS = 2000;
  const PROTOCOL_KEY = "autorl.protocol";

  function num(value, digits) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits === undefined ? 2 : digits);
  }

  function signed(value) {
    if (value === null || value === undefined) return "–";
    return (value >= 0 ? "+" : "") + Number(value).toFixed(2);
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.max(0, Math.round(seconds));
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const rest = String(s % 60).padStart(2, "0");
    return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${rest}` : `${m}:${rest}`;
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  // Puts fresh rows into a table body, replacing only the rows (and within a row only the cells)
  // that changed: a link the operator is clicking or text being selected survives a poll.
  function syncRows(body, rows) {
    rows.forEach((row, i) => {
      const old = body.children[i];
      if (!old) {
        body.appendChild(row);
      } else if (!old.isEqualNode(row)) {
        const sameShape =
          old.cells.length === row.cells.length && old.dataset.name === row.dataset.name && old.dataset.id === row.dataset.id;
        if (!sameShape) {
          old.replaceWith(row);
        } else {
          Array.from(row.cells).forEach((td, j) => {
            if (!old.cells[j].isEqualNode(td)) old.cells[j].replaceWith(td.cloneNode(true));
          });
          for (const attr of row.attributes) old.setAttribute(attr.name, attr.value);
        }
      }
    });
    while (body.children.length > rows.length) body.lastElementChild.remove();
  }

  function setStatus(text, failed) {
    const el = document.getElementById("updated");
    if (!el) return;
    el.textContent = text;
    el.classList.toggle("down", Boolean(failed));
  }

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } });
    if (response.status === 401) {
      window.location.assign("/ui/login");
      throw new Error("signed out");
    }
    if (!response.ok) {
      let detail = response.statusText;
      try {
        detail = (await response.json()).detail || detail;
      } catch (_) {
        // not JSON: keep the status text
      }
      throw new Error(detail);
    }
    return response.json();
  }

  function poll(refresh) {
    const tick = async () => {
      try {
        await refresh();
        window.autorlPolls = (window.autorlPolls || 0) + 1; // finished refreshes, for scripts watching
        setStatus("updated " + new Date().toLocaleTimeString(), false);
      } catch (error) {
        setStatus("update failed: " + (error.message || error), true);
      } finally {
        window.setTimeout(tick, POLL_MS);
      }
    };
    tick();
  }

  function queueText(exp) {
    if (!exp.queued && !exp.running) return "–";
    const parts = [];
    if (exp.running) parts.push(`${exp.running} running`);
    if (exp.queued) parts.push(`${exp.queued} queued` + (exp.queue_position ? ` (next #${exp.queue_position})` : ""));
    return parts.join(", ");
  }

  function timeLeft(exp) {
    if (!["pending", "baseline", "running", "finishing"].includes(exp.phase)) return "ended";
    return exp.start_time === null ? "not started" : duration(exp.remaining_s);
  }

  function submissionsText(exp) {
    const failed = exp.failed_submissions ? `, ${exp.failed_submissions} failed` : "";
    // Refused after the grader read their weights: no submission, but counted against the limit.
    const refused = exp.refused_submissions ? `, ${exp.refused_submissions} refused` : "";
    return `${exp.submissions}/${exp.total_submissions}${failed}${refused}`;
  }

  // A sealed experiment's one result on the test split: its score and 95 % interval once scored.
  function finalText(final) {
    if (!final) return "–";
    const of = `of #${final.of}, ${final.selection.replaceAll("_", " ")}`;
    if (final.status === null) return `not made yet (${of})`;
    if (final.status !== "scored") return `${final.status} (${of})`;
    const interval = final.interval ? ` [${num(final.interval[0])}–${num(final.interval[1])}]` : "";
    return `${num(final.score)}${interval} (${of})`;
  }

  // --- the experiments table -----------------------------------------------------------------

  const ACTIVE_PHASES = ["pending", "baseline", "running", "finishing"];
  // Filters and sort live in the query string (?agent=example_grpo&sort=best&order=desc): a link
  // shares them and a reload keeps them. A value from the URL is data like any other: compared with
  // the experiments' values and shown as an option's text, never parsed as markup.
  const FILTERS = {
    task: (exp) => exp.task,
    agent: (exp) => exp.agent,
    model: (exp) => exp.model,
    phase: (exp) => exp.phase,
    feedback: (exp) => exp.feedback,
  };
  // One sort key per column, the value the column shows; a missing value sorts last either way.
  const SORT_KEYS = {
    name: (exp) => exp.name,
    phase: FILTERS.phase,
    task: FILTERS.task,
    model: FILTERS.model,
    agent: FILTERS.agent,
    baseline: (exp) => (exp.feedback === "sealed" ? exp.validation_baseline_score : exp.baseline_score),
    best: (exp) => exp.best_score,
    improvement: (exp) => exp.improvement,
    submissions: (exp) => exp.submissions,
    left: (exp) => (ACTIVE_PHASES.includes(exp.phase) && exp.start_time !== null ? exp.remaining_s : null),
    queue: (exp) => exp.running + exp.queued,
    waiting: (exp) => exp.waiting_reason,
  };

  function viewFromURL() {
    const params = new URLSearchParams(window.location.search);
    const view = { filters: {}, sort: null, order: params.get("order") === "desc" ? "desc" : "asc" };
    for (const key of Object.keys(FILTERS)) {
      if (params.get(key)) view.filters[key] = params.get(key);
    }
    if (Object.hasOwn(SORT_KEYS, params.get("sort") || "")) view.sort = params.get("sort");
    return view;
  }

  function writeURL(view) {
    const params = new URLSearchParams(view.filters);
    if (view.sort) {
      params.set("sort", view.sort);
      params.set("order", view.order);
    }
    const query = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (query ? "?" + query : ""));
  }

  function missing(value) {
    return value === null || value === undefined;
  }

  function shownExperiments(experiments, view) {
    const rows = experiments.filter((exp) =>
      Object.entries(view.filters).every(([key, value]) => FILTERS[key](exp) === value),
    );
    if (!view.sort) return rows;
    const key = SORT_KEYS[view.sort];
    const sign = view.order === "desc" ? -1 : 1;
    return rows.sort((a, b) => {
      const [x, y] = [key(a), key(b)];
      if (missing(x) || missing(y)) return missing(x) - missing(y) || a.name.localeCompare(b.name);
      const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
      return sign * order || a.name.localeCompare(b.name);
    });
  }

  // Each filter offers the values present (and the chosen one, even if none has it any more).
  function fillFilter(select, values, chosen) {
    const wanted = ["", ...Array.from(new Set([...values, ...(chosen ? [chosen] : [])])).sort()];
    const current = Array.from(select.options, (option) => option.value);
    if (wanted.length !== current.length || wanted.some((value, i) => value !== current[i])) {
      select.replaceChildren(
        ...wanted.map((value) => {
          const option = document.createElement("option");
          option.value = value;
          option.textContent = value === "" ? "all" : value;
          return option;
        }),
      );
    }
    select.value = chosen || "";
  }

  function experimentRow(exp) {
    const tr = document.createElement("tr");
    tr.dataset.name = exp.name;
    const link = document.createElement("a");
    link.href = "/ui/experiments/" + encodeURIComponent(exp.name);
    link.textContent = exp.name;
    cell(tr, "").appendChild(link);
    cell(tr, exp.phase, "phase-" + exp.phase);
    cell(tr, exp.task);
    cell(tr, exp.model, "path");
    cell(tr, exp.agent || "–");
    // Sealed: the baseline, best and improvement the agent is scored on, all on validation;
    // its result on test is on the experiment's page.
    const sealed = exp.feedback === "sealed";
    const scores = [
      cell(tr, num(sealed ? exp.validation_baseline_score : exp.baseline_score), "num"),
      cell(tr, num(exp.best_score), "num"),
      cell(tr, signed(exp.improvement), "num " + (exp.improvement > 0 ? "up" : exp.improvement < 0 ? "down" : "")),
    ];
    if (sealed) {
      scores.forEach((td) => {
        td.title = `sealed: on the validation split; final on test: ${finalText(exp.final)}`;
      });
    }
    cell(tr, submissionsText(exp), "num");
    cell(tr, timeLeft(exp), "num");
    cell(tr, queueText(exp));
    // Why its baseline waits (the reason kubectl and autorl run show), what to do on hover.
    const waits = cell(tr, exp.waiting_reason || "–", exp.waiting_reason ? "waiting" : "");
    if (exp.waiting_message) waits.title = exp.waiting_message;
    return tr;
  }

  function experimentsPage() {
    const body = document.querySelector("#experiments tbody");
    const empty = document.getElementById("empty");
    const noneYet = empty.textContent;
    const form = document.getElementById("filters");
    const headers = document.querySelectorAll("#experiments th[data-sort]");
    const view = viewFromURL();
    let experiments = [];

    function render() {
      for (const [key, value] of Object.entries(FILTERS)) {
        const values = experiments.map(value).filter((v) => !missing(v));
        fillFilter(form.elements[key], values, view.filters[key]);
      }
      headers.forEach((th) => {
        const sorted = th.dataset.sort === view.sort;
        if (sorted) th.setAttribute("aria-sort", view.order === "desc" ? "descending" : "ascending");
        else th.removeAttribute("aria-sort");
      });
      const rows = shownExperiments(experiments, view).map(experimentRow);
      syncRows(body, rows);
      empty.textContent = experiments.length ? "No experiment matches these filters." : noneYet;
      empty.hidden = rows.length > 0;
      document.getElementById("shown").textContent = `${rows.length} of ${experiments.length} shown`;
    }

    form.addEventListener("submit", (event) => event.preventDefault());
    form.addEventListener("change", (event) => {
      const { name, value } = event.target;
      if (!Object.hasOwn(FILTERS, name)) return;
      if (value) view.filters[name] = value;
      else delete view.filters[name];
      writeURL(view);
      render();
    });
    // A header sorts by its column; the sorted column's header again reverses the order.
    headers.forEach((th) => {
      th.querySelector("button").addEventListener("click", () => {
        view.order = view.sort === th.dataset.sort && view.order === "asc" ? "desc" : "asc";
        view.sort = th.dataset.sort;
        writeURL(view);
        render();
      });
    });
    poll(async () => {
      experiments = (await getJSON("/ui/api/experiments")).experiments;
      render();
    });
  }

  // --- one experiment ------------------------------------------------------------------------

  function summaryItems(target, items) {
    const nodes = items.map(([label, value]) => {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = label;
      dd.textContent = value === null || value === undefined ? "–" : String(value);
      div.append(dt, dd);
      return div;
    });
    target.replaceChildren(...nodes);
  }

  const POINT_COLOR = "#1f77b4";
  const BEST_COLOR = "#d62728";
  const INTERVAL_COLOR = "rgba(31, 119, 180, 0.45)";
  // A sealed experiment's final evaluation on test and the baseline on test: apart from the rest.
  const FINAL_COLOR = "#9467bd";
  const FINAL_INTERVAL_COLOR = "rgba(148, 103, 189, 0.55)";
  const TEST_BASELINE_COLOR = "#ff7f0e";
  const FINAL_DATASET = 2;
  // Inside a point that is not distinguishable from the baseline: hollow.
  const HOLLOW = "#ffffff";

  // Each scored submission's 95 % interval as an error bar behind its point (from the submission's
  // `interval`; only for the headline protocol, whose score the interval is of), and a sealed
  // experiment's final evaluation's in its own colour.
  const intervalBars = {
    id: "intervalBars",
    beforeDatasetsDraw(chart) {
      drawBars(chart, 0, INTERVAL_COLOR);
      drawBars(chart, FINAL_DATASET, FINAL_INTERVAL_COLOR);
    },
  };

  function drawBars(chart, index, color) {
    const raws = chart.data.datasets[index].data;
    const scale = chart.scales.y;
    const ctx = chart.ctx;
    ctx.save();
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    chart.getDatasetMeta(index).data.forEach((element, i) => {
      const raw = raws[i];
      if (!raw || raw.low === null || raw.high === null) return;
      const top = scale.getPixelForValue(raw.high);
      const bottom = scale.getPixelForValue(raw.low);
      ctx.beginPath();
      for (const [x0, y0, x1, y1] of [
        [element.x, top, element.x, bottom],
        [element.x - 5, top, element.x + 5, top],
        [element.x - 5, bottom, element.x + 5, bottom],
      ]) {
        ctx.moveTo(x0, y0);
        ctx.lineTo(x1, y1);
      }
      ctx.stroke();
    });
    ctx.restore();
  }

  // The tooltip of a submission's point: its score, its 95 % interval, and whether it can be told
  // from the baseline (canvas text: nothing here is parsed as markup).
  function pointLabel(raw) {
    const lines = [`#${raw.id}: ${num(raw.y)}${raw.best ? " (best)" : ""}${raw.reused ? " (reused)" : ""}`];
    if (raw.low !== null && raw.high !== null) lines.push(`95 % interval ${num(raw.low)}–${num(raw.high)}`);
    if (raw.distinguishable === false) lines.push("not distinguishable from the baseline (hollow)");
    if (raw.distinguishable === true) lines.push("distinguishable from the baseline");
    return lines;
  }

  function finalLabel(raw) {
    const lines = [`final #${raw.id} on test (of #${raw.of}): ${num(raw.y)}`];
    if (raw.low !== null && raw.high !== null) lines.push(`95 % interval ${num(raw.low)}–${num(raw.high)}`);
    if (raw.distinguishable !== null) {
      lines.push(`${raw.distinguishable ? "" : "not "}distinguishable from the baseline on test`);
    }
    return lines;
  }

  function makeChart(canvas) {
    return new window.Chart(canvas, {
      type: "scatter",
      plugins: [intervalBars],
      data: {
        datasets: [
          {
            label: "submissions",
            data: [],
            showLine: true,
            borderColor: "#aec7e8",
            backgroundColor: POINT_COLOR,
            pointRadius: (ctx) => (ctx.raw && ctx.raw.best ? 10 : 5),
            pointHoverRadius: (ctx) => (ctx.raw && ctx.raw.best ? 12 : 7),
            pointStyle: (ctx) => (ctx.raw && ctx.raw.best ? "star" : "circle"),
            pointBorderColor: (ctx) => (ctx.raw && ctx.raw.best ? BEST_COLOR : POINT_COLOR),
            pointBackgroundColor: (ctx) =>
              ctx.raw && ctx.raw.distinguishable === false ? HOLLOW : ctx.raw && ctx.raw.best ? BEST_COLOR : POINT_COLOR,
            pointBorderWidth: (ctx) => (ctx.raw && (ctx.raw.best || ctx.raw.distinguishable === false) ? 2 : 1),
          },
          {
            label: "baseline",
            data: [],
            showLine: true,
            pointRadius: 0,
            borderColor: "#2ca02c",
            borderDash: [6, 4],
          },
          {
            label: "final (test)",
            data: [],
            pointStyle: "rectRot",
            pointRadius: 9,
            pointHoverRadius: 11,
            borderColor: FINAL_COLOR,
            backgroundColor: FINAL_COLOR,
            pointBackgroundColor: (ctx) => (ctx.raw && ctx.raw.distinguishable === false ? HOLLOW : FINAL_COLOR),
            pointBorderWidth: 2,
          },
          {
            label: "baseline (test)",
            data: [],
            showLine: true,
            pointRadius: 0,
            borderColor: TEST_BASELINE_COLOR,
            borderDash: [2, 3],
          },
        ],
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          x: { type: "linear", title: { display: true, text: "minutes since the budget started" } },
          y: { title: { display: true, text: "score" }, suggestedMin: 0 },
        },
        plugins: {
          // The sealed-only series are named only where they have something to show.
          legend: {
            labels: {
              filter: (item, data) => item.datasetIndex < FINAL_DATASET || data.datasets[item.datasetIndex].data.length > 0,
            },
          },
          tooltip: {
            callbacks: {
              label: (ctx) =>
                ctx.datasetIndex === 0
                  ? pointLabel(ctx.raw)
                  : ctx.datasetIndex === FINAL_DATASET
                    ? finalLabel(ctx.raw)
                    : `${ctx.dataset.label} ${num(ctx.raw.y)}`,
            },
          },
        },
      },
    });
  }

  function drawChart(chart, detail, protocol) {
    const series = detail.chart.protocols[protocol];
    // A submission's interval and comparison are of its headline score: shown with that protocol only.
    const headline = protocol === detail.chart.headline;
    const byId = new Map(detail.submissions.map((sub) => [sub.submission_id, sub]));
    const points = series.points.map((p) => {
      const sub = headline ? byId.get(p.submission_id) : undefined;
      const interval = sub && sub.interval ? sub.interval : null;
      return {
        x: p.t_s / 60,
        y: p.score,
        id: p.submission_id,
        best: p.submission_id === series.best_submission,
        reused: p.reused,
        low: interval ? interval[0] : null,
        high: interval ? interval[1] : null,
        distinguishable: sub && sub.comparison ? sub.comparison.distinguishable : null,
      };
    });
    const final = series.final;
    const finals = final ? [finalPoint(final, headline ? byId.get(final.submission_id) : undefined)] : [];
    const xs = points.concat(finals).map((p) => p.x);
    const elapsed = detail.experiment.start_time === null ? 0 : (detail.now - detail.chart.origin) / 60;
    const right = Math.max(elapsed, ...xs, 1);
    const line = (y) => (y === null || y === undefined ? [] : [{ x: 0, y: y }, { x: right, y: y }]);
    // Sealed: the points and their baseline are on validation; the final and its baseline on test.
    const validation = series.split === "validation";
    chart.data.datasets[0].label = validation ? "submissions (validation)" : "submissions";
    chart.data.datasets[1].label = validation ? "baseline (validation)" : "baseline";
    chart.data.datasets[0].data = points;
    chart.data.datasets[1].data = line(series.baseline);
    chart.data.datasets[FINAL_DATASET].data = finals;
    chart.data.datasets[3].data = final ? line(final.baseline) : [];
    chart.options.scales.y.title.text = `score (${protocol})`;
    // Room for the top of every interval's bar.
    const highs = points.concat(finals).map((p) => p.high).filter((high) => high !== null);
    chart.options.scales.y.suggestedMax = highs.length ? Math.min(100, Math.max(...highs)) : undefined;
    chart.update("none");
  }

  function finalPoint(final, sub) {
    const interval = sub && sub.interval ? sub.interval : null;
    return {
      x: final.t_s / 60,
      y: final.score,
      id: final.submission_id,
      of: final.of,
      low: interval ? interval[0] : null,
      high: interval ? interval[1] : null,
      distinguishable: sub && sub.comparison ? sub.comparison.distinguishable : null,
    };
  }

  // A score's 95 % interval and its paired comparison with the baseline, for the score's tooltip.
  function uncertaintyText(sub) {
    if (!sub.interval) return "";
    const lines = [`95 % interval ${num(sub.interval[0])}–${num(sub.interval[1])}`];
    const c = sub.comparison;
    if (c) {
      lines.push(
        `vs baseline ${signed(c.difference)} points (95 % ${signed(c.interval[0])} to ${signed(c.interval[1])}), ` +
          `McNemar p = ${Number(c.p_value).toPrecision(3)}, discordant ${c.discordant[0]}/${c.discordant[1]}`,
        c.distinguishable ? "distinguishable from the baseline" : "not distinguishable from the baseline",
      );
    }
    return lines.join("\n");
  }

  // A submission's id, with what it is; a sealed experiment's rows also name their split.
  function idText(sub, sealed) {
    const id = String(sub.submission_id);
    if (!sealed) return sub.is_baseline ? `${id} (baseline)` : id;
    if (sub.is_baseline) return `${id} (baseline, ${sub.split})`;
    return sub.final_of === null ? id : `${id} (final on test, of #${sub.final_of})`;
  }

  function submissionRow(sub, sealed) {
    const tr = document.createElement("tr");
    tr.dataset.id = String(sub.submission_id);
    cell(tr, idText(sub, sealed), "num");
    cell(tr, sub.status, "status-" + sub.status);
    const score = cell(tr, num(sub.score), sub.comparison && !sub.comparison.distinguishable ? "num indistinct" : "num");
    score.title = uncertaintyText(sub);
    cell(tr, sub.status === "queued" && sub.queue_position ? `#${sub.queue_position}` : sub.status === "running" ? "evaluating" : "–");
    cell(tr, num(sub.eval_seconds, 1), "num");
    cell(tr, sub.reused ? `yes (from #${sub.reused_from})` : "");
    cell(tr, sub.t_s === null ? "–" : (sub.t_s < 0 ? "before start" : "+" + duration(sub.t_s)), "num");
    cell(tr, sub.model_path, "path");
    cell(tr, sub.error || "", "error");
    return tr;
  }

  const METRICS = [
    ["valid_submission_rate", "valid submission rate"],
    ["first_valid_idx", "first valid submission"],
    ["first_valid_delay", "first valid after (s)"],
    ["time_to_first_improvement", "first improvement after (s)"],
    ["time_to_best", "best after (s)"],
    ["monotonic_ratio", "monotonic ratio"],
    ["copy_model_count", "copies of the base model"],
    ["time_used_ratio", "share of budget used"],
    ["last_submit_gap", "last submission before end (s)"],
  ];

  function metricText(key, value) {
    if (value === null || value === undefined) return "–";
    return /_(rate|ratio)$/.test(key) ? `${(100 * value).toFixed(1)} %` : String(value);
  }

  function experimentPage() {
    const name = decodeURIComponent(window.location.pathname.split("/").pop());
    const base = "/ui/api/experiments/" + encodeURIComponent(name);
    const select = document.getElementById("protocol");
    const log = document.getElementById("log");
    const runnerLog = document.getElementById("runner-log");
    const chart = makeChart(document.getElementById("chart"));
    let latest = null;
    let chosen = window.sessionStorage.getItem(PROTOCOL_KEY);
    document.getElementById("title").textContent = name;
    document.title = `AutoRL dashboard · ${name}`;
    select.addEventListener("change", () => {
      chosen = select.value;
      window.sessionStorage.setItem(PROTOCOL_KEY, chosen);
      if (latest) drawChart(chart, latest, chosen);
    });
    poll(async () => {
      const [detail, tail, runnerTail] = await Promise.all([
        getJSON(base),
        getJSON(base + "/log?source=agent"),
        getJSON(base + "/log?source=runner"),
      ]);
      latest = detail;
      const exp = detail.experiment;
      if (!chosen) chosen = detail.chart.headline;
      select.value = chosen;
      const waiting = exp.waiting_reason ? `${exp.waiting_reason}: ${exp.waiting_message}` : "";
      document.getElementById("message").textContent = waiting || exp.message || "";
      const sealed = exp.feedback === "sealed";
      const best = exp.best_submission ? `${num(exp.best_score)} (#${exp.best_submission})` : "–";
      const scores = sealed
        ? [
            ["feedback", "sealed"],
            ["baseline (validation)", num(exp.validation_baseline_score)],
            ["best (validation)", best],
            ["improvement (validation)", signed(exp.improvement)],
            ["baseline (test)", num(exp.baseline_score)],
            ["final (test)", finalText(exp.final)],
            ["test evaluations", String(exp.test_evaluations)],
          ]
        : [
            ["baseline", num(exp.baseline_score)],
            ["best", best],
            ["improvement", signed(exp.improvement)],
          ];
      const brought = [];
      // What a check could not verify rides in the message (autorl.provenance.unverified).
      const notes = (exp.message || "").split("; ");
      const unverified = (what) => {
        const found = notes.find((part) => part.startsWith(`${what} unverified: `));
        return found ? ` ⚠ unverified: ${found.slice(what.length + 13)}` : "";
      };
      const testNote = unverified("test questions");
      if (exp.test_overlap !== null) {
        brought.push(["test overlap", (exp.test_overlap ? `${exp.test_overlap} ⚠ test problems in the agent's files` : "0") + testNote]);
      } else if (testNote) {
        brought.push(["test overlap", testNote.trim()]);
      }
      if (exp.twin_score !== null) {
        const flagged = exp.twin_p_value !== null && exp.twin_p_value < 0.01;
        brought.push(["twin split", `${num(exp.twin_score)} (p=${exp.twin_p_value.toPrecision(3)})${flagged ? " ⚠ learned by heart?" : ""}`]);
      } else if (unverified("twin split")) {
        brought.push(["twin split", unverified("twin split").trim()]);
      }
      if (exp.lineage) brought.push(["lineage", `⚠ nearer ${exp.lineage} than the base`]);
      summaryItems(document.getElementById("summary"), [
        ["phase", exp.phase],
        ["task", exp.task],
        ["base model", exp.model],
        ["agent", exp.agent],
        ["headline protocol", exp.protocol],
        ...scores,
        ["submissions (scored/all)", submissionsText(exp)],
        // Submissions that failed for the platform's reasons are not counted; refused submits are.
        ["limit used", `${exp.counted_submissions} of ${exp.max_submissions}`],
        ["time left", timeLeft(exp)],
        ["queue", queueText(exp)],
        ["evaluators", exp.evaluators === null ? "–" : String(exp.evaluators)],
        ...brought,
      ]);
      document.getElementById("chart-sealed").hidden = !sealed;
      drawChart(chart, detail, chosen);
      syncRows(document.querySelector("#submissions tbody"), detail.submissions.map((sub) => submissionRow(sub, sealed)));
      summaryItems(
        document.getElementById("metrics"),
        METRICS.map(([key, label]) => [label, metricText(key, detail.metrics[key])]),
      );
      showLog(log, document.getElementById("log-note"), tail);
      showLog(runnerLog, document.getElementById("runner-log-note"), runnerTail);
    });
  }

  // Each log in its own panel: the platform's events never share one with the agent's output.
  function showLog(pre, note, tail) {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = tail.available ? tail.text : "";
    note.textContent = tail.available
      ? tail.truncated
        ? `(the last ${Math.round(tail.text.length / 1024)} KiB of ${Math.round(tail.size_bytes / 1024)} KiB)`
        : ""
      : `(${tail.reason})`;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  const page = document.body.dataset.page;
  if (page === "experiments") experimentsPage();
  if (page === "experiment") experimentPage();
})();
