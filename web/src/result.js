// A run's result as a page shows it: its status, the images it made, its files with their download
// links, what went wrong. The playground (main.js) and the run's MCP Apps view (run-view.js) both
// render results with these, so the two always show a result the same way.

import { looksLikeMarkdown, renderMarkdown } from "./render.js";

export function element(tag, properties = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, properties);
  node.append(...children);
  return node;
}

export function humanSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/** Show `status` (success, error, timeout, validation_error, running, cancelled) in the badge `badge`. */
export function setBadge(badge, status, label = status) {
  badge.className = `badge ${status}`;
  badge.textContent = label.replace("_", " ");
}

/** The result's status: structuredContent's, else from isError. */
export function statusOf(result) {
  return result.structuredContent?.status ?? (result.isError ? "error" : "success");
}

/** "exit code N", or "" when the run has none. */
export function exitCodeText(data) {
  return data.exitCode === null || data.exitCode === undefined ? "" : `exit code ${data.exitCode}`;
}

/** What the reader should know went wrong or was cut, one line each. */
export function problemsOf(result) {
  const data = result.structuredContent ?? {};
  const problems = [data.error, data.warning].filter(Boolean);
  if (!data.status && result.isError) {
    problems.push(...(result.content ?? []).filter((block) => block.type === "text").map((block) => block.text));
  }
  if (data.truncated) problems.push("The output was truncated.");
  if (data.imagesDropped) problems.push(`${data.imagesDropped} image(s) were dropped.`);
  return problems;
}

/** The images (plots) of the result's content, as <img> elements with data: URLs. */
export function resultImages(result) {
  const images = (result.content ?? []).filter((block) => block.type === "image");
  return images.map((image, index) =>
    element("img", { src: `data:${image.mimeType};base64,${image.data}`, alt: `Image ${index + 1} from the run` }),
  );
}

/** Table rows for `files` ({name, size, url}), by name; `onLink(file, event)` may take a link's click. */
export function fileRows(files, onLink = null) {
  return [...files]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((file) => {
      const link = file.url
        ? element("a", { href: file.url, textContent: "download", download: file.name.split("/").pop(), rel: "noopener noreferrer" })
        : element("span", { textContent: "no link" });
      if (file.url) {
        link.setAttribute("aria-label", `Download ${file.name}`);
        if (onLink) link.addEventListener("click", (event) => onLink(file, event));
      }
      return element(
        "tr",
        {},
        element("td", { textContent: file.name }),
        element("td", { textContent: humanSize(file.size) }),
        element("td", {}, link),
      );
    });
}

/** Show a run's stdout in ``ui``'s blocks: as text, and as Markdown (on by default) where it looks like it. */
export function showStdout(ui, text) {
  ui.stdout.textContent = text;
  const markdown = Boolean(text) && looksLikeMarkdown(text);
  ui.toggleMarkdown.hidden = !markdown;
  ui.stdoutMarkdown.replaceChildren(markdown ? renderMarkdown(text) : "");
  showMarkdown(ui, markdown);
  ui.stdoutBlock.hidden = !text;
}

/** Show ``ui``'s stdout as rendered Markdown (``on``) or as raw text. */
export function showMarkdown(ui, on) {
  ui.stdoutMarkdown.hidden = !on;
  ui.stdout.hidden = on;
  ui.toggleMarkdown.textContent = on ? "Show raw" : "Show Markdown";
  ui.toggleMarkdown.setAttribute("aria-pressed", String(on));
}

/** Show a running run's last lines (`run`: its view's state, `lines` and `skipped`) in `ui.live`. */
export function showLive(ui, run, most) {
  const lines = run.lines ?? [];
  const skipped = (run.skipped ?? 0) + Math.max(0, lines.length - most);
  const text = (skipped > 0 ? `… ${skipped} earlier lines\n` : "") + lines.slice(-most).join("\n");
  ui.live.textContent = text;
  ui.liveBlock.hidden = !text;
  ui.live.scrollTop = ui.live.scrollHeight;
}
