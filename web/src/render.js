// Output as Markdown, sanitised: markdown-it with raw HTML off (any tag in the output is shown as
// text), then DOMPurify over what it made, so no script, handler or javascript: URL from the
// code's output can ever run in the page.
import DOMPurify from "dompurify";
import MarkdownIt from "markdown-it";

const markdown = new MarkdownIt({ html: false, linkify: false, typographer: false });

// Table alignment as classes, not style attributes (the page's CSP allows no inline style).
for (const rule of ["th_open", "td_open"]) {
  markdown.renderer.rules[rule] = (tokens, index, options, env, self) => {
    const token = tokens[index];
    const align = /text-align:\s*(left|right|center)/.exec(token.attrGet("style") ?? "");
    token.attrs = (token.attrs ?? []).filter(([name]) => name !== "style");
    if (align) token.attrJoin("class", `align-${align[1]}`);
    return self.renderToken(tokens, index, options);
  };
}

// Headings, tables, lists, emphasis, fences, quotes: output that means to be Markdown.
const MARKDOWN_HINT = /^(#{1,6} \S|\|.*\|\s*$|\s*[-*+] \S|\s*\d+\. \S|```|> \S)|\*\*\S[^*\n]*\*\*/m;

export function looksLikeMarkdown(text) {
  return MARKDOWN_HINT.test(text);
}

/** A fragment with `text` rendered as sanitised Markdown. */
export function renderMarkdown(text) {
  const html = markdown.render(text);
  const fragment = DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    USE_PROFILES: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "img", "iframe", "object", "embed"],
    FORBID_ATTR: ["style"],
  });
  for (const link of fragment.querySelectorAll("a")) {
    link.setAttribute("rel", "noopener noreferrer");
    link.setAttribute("target", "_blank");
  }
  return fragment;
}
