// A real MCP Apps host page for tests/e2e/http/test_run_view.py: the ext-apps AppBridge (the host side of
// @modelcontextprotocol/ext-apps, which its reference host is built on) over the playground's MCP
// client (web/src/mcp.js). Like the reference host it reads the tool's ui:// resource, renders it in
// a sandboxed iframe (scripts only, an opaque origin) under a Content-Security-Policy made from the
// resource's declared `_meta.ui.csp`, forwards the view's tools/call and resources/read to the
// server, and hands the view the tool's input and result. The test drives it through `window.host`.
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

import { McpClient } from "../../../web/src/mcp.js";

const MIME = "text/html;profile=mcp-app";

/** The CSP a host applies to a view that declared `csp` (nothing declared: nothing reachable). */
function policyFor(csp = {}) {
  const resources = (csp.resourceDomains ?? []).join(" ");
  const connect = (csp.connectDomains ?? []).join(" ") || "'none'";
  return [
    "default-src 'none'",
    `script-src 'unsafe-inline' ${resources}`,
    `style-src 'unsafe-inline' ${resources}`,
    `img-src data: ${resources}`,
    `connect-src ${connect}`,
    "frame-src 'none'",
  ].join("; ");
}

class Host {
  constructor(token) {
    this.client = new McpClient("/mcp", token);
    this.opened = []; // the links the view asked the host to open
    this.tools = new Map();
    this.bridge = null;
    this.context = { theme: "light", platform: "web" };
  }

  async connect() {
    await this.client.connect();
    for (const tool of (await this.client.listTools()).tools ?? []) this.tools.set(tool.name, tool);
  }

  /** Render the view at `uri` in a fresh sandboxed iframe; resolves once the view initialized. */
  async render(uri, tool) {
    const read = await this.client.request("resources/read", { uri });
    const content = read.contents[0];
    if (content.mimeType !== MIME) throw new Error(`${uri} is ${content.mimeType}, not ${MIME}`);
    const policy = `<meta http-equiv="Content-Security-Policy" content="${policyFor(content._meta?.ui?.csp)}">`;
    const html = content.text.replace("<head>", `<head>${policy}`);
    document.getElementById("view")?.remove();
    const iframe = document.createElement("iframe");
    iframe.id = "view";
    iframe.sandbox = "allow-scripts";
    iframe.style.cssText = "width: 640px; height: 400px; border: 1px solid #ccc; border-radius: 8px";
    document.body.append(iframe);
    const bridge = new AppBridge(
      null,
      { name: "mcp-sandbox test host", version: "1" },
      { openLinks: {}, serverTools: {}, serverResources: {} },
      { hostContext: { ...this.context, toolInfo: { tool: this.tools.get(tool) } } },
    );
    bridge.oncalltool = (params, extra) => this.client.request("tools/call", params, null, extra.mcpReq.signal);
    bridge.onreadresource = (params) => this.client.request("resources/read", params);
    bridge.onopenlink = async ({ url }) => {
      this.opened.push(url);
      return {};
    };
    bridge.onsizechange = ({ height }) => {
      if (height) iframe.style.height = `${Math.ceil(height)}px`;
    };
    const initialized = new Promise((resolve) => (bridge.oninitialized = resolve));
    await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
    iframe.srcdoc = html;
    this.bridge = bridge;
    await initialized;
  }

  /** Call `tool` as a chat host does: render the tool's view, hand it the input, then the result. */
  async call(tool, args) {
    const uri = this.tools.get(tool)?._meta?.ui?.resourceUri;
    await this.render(uri, tool);
    await this.bridge.sendToolInput({ arguments: args });
    const result = await this.client.request("tools/call", { name: tool, arguments: args });
    window.resultArrived = performance.now();
    await this.bridge.sendToolResult(result);
    return result;
  }

  /** Call `tool` as a task; render the run's own view, which the task links. */
  async callAsTask(tool, args) {
    const created = await this.client.request("tools/call", { name: tool, arguments: args, task: {} });
    window.resultArrived = performance.now();
    await this.render(created._meta.ui.resourceUri, tool);
    return created;
  }

  setTheme(theme) {
    this.context = { ...this.context, theme };
    this.bridge?.setHostContext(this.context);
  }
}

window.Host = Host;
