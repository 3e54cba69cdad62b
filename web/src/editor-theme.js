// The editor's colours, light or dark as the system asks (prefers-color-scheme): every colour is a
// CSS variable of playground.css, so the page's media query switches the editor along with the
// page; only CodeMirror's own dark flag (for its panels and tooltips) follows the media query here.
import { HighlightStyle, syntaxHighlighting } from "@codemirror/language";
import { Compartment } from "@codemirror/state";
import { EditorView } from "@codemirror/view";
import { tags as t } from "@lezer/highlight";

const DARK = window.matchMedia("(prefers-color-scheme: dark)");

const theme = EditorView.theme({
  "&": { color: "var(--fg)", backgroundColor: "var(--code-bg)" },
  ".cm-content": { caretColor: "var(--fg)" },
  ".cm-cursor, .cm-dropCursor": { borderLeftColor: "var(--fg)" },
  "&.cm-focused > .cm-scroller > .cm-selectionLayer .cm-selectionBackground, .cm-selectionBackground, .cm-content ::selection":
    { backgroundColor: "var(--code-selection)" },
  ".cm-gutters": { backgroundColor: "var(--code-gutter-bg)", color: "var(--muted)", borderRight: "1px solid var(--line)" },
  ".cm-activeLine": { backgroundColor: "var(--code-active-line)" },
  ".cm-activeLineGutter": { backgroundColor: "var(--code-active-line)", color: "var(--fg)" },
  "&.cm-focused .cm-matchingBracket": { backgroundColor: "var(--code-bracket)", outline: "none" },
  ".cm-searchMatch": { backgroundColor: "var(--code-search)" },
  ".cm-selectionMatch": { backgroundColor: "var(--code-selection-match)" },
  ".cm-foldPlaceholder": { backgroundColor: "var(--badge-bg)", color: "var(--muted)", border: "none" },
  ".cm-tooltip": { backgroundColor: "var(--panel)", color: "var(--fg)", border: "1px solid var(--line)" },
  ".cm-tooltip-autocomplete > ul > li[aria-selected]": { backgroundColor: "var(--primary)", color: "var(--on-primary)" },
  ".cm-panels": { backgroundColor: "var(--panel)", color: "var(--fg)" },
});

const highlight = HighlightStyle.define([
  { tag: [t.keyword, t.controlKeyword, t.moduleKeyword, t.operatorKeyword], color: "var(--tok-keyword)" },
  { tag: [t.atom, t.bool, t.null, t.special(t.variableName), t.self], color: "var(--tok-atom)" },
  { tag: [t.number, t.integer, t.float], color: "var(--tok-number)" },
  { tag: [t.string, t.special(t.string), t.docString], color: "var(--tok-string)" },
  { tag: [t.regexp, t.escape], color: "var(--tok-regexp)" },
  { tag: t.comment, color: "var(--tok-comment)", fontStyle: "italic" },
  { tag: [t.definition(t.variableName), t.function(t.definition(t.variableName))], color: "var(--tok-definition)" },
  { tag: [t.function(t.variableName), t.function(t.propertyName)], color: "var(--tok-function)" },
  { tag: [t.typeName, t.className, t.namespace, t.definition(t.className)], color: "var(--tok-type)" },
  { tag: [t.meta, t.processingInstruction, t.annotation], color: "var(--tok-meta)" },
  { tag: t.propertyName, color: "var(--tok-property)" },
  { tag: t.invalid, color: "var(--bad)" },
  { tag: t.strong, fontWeight: "bold" },
  { tag: t.emphasis, fontStyle: "italic" },
  { tag: t.link, textDecoration: "underline" },
  { tag: t.heading, fontWeight: "bold" },
]);

const darkFlag = new Compartment();

/** The editor's look: its theme, its highlighting, and CodeMirror's dark flag as the system is now. */
export function editorLook() {
  return [theme, syntaxHighlighting(highlight), darkFlag.of(EditorView.darkTheme.of(DARK.matches))];
}

/** Keep `view`'s dark flag in step when the system switches between light and dark. */
export function followColorScheme(view) {
  DARK.addEventListener("change", () => {
    view.dispatch({ effects: darkFlag.reconfigure(EditorView.darkTheme.of(DARK.matches)) });
  });
}
