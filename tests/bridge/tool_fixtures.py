"""Tool lists shaped like what real servers send: zod-to-json-schema (TypeScript) and pydantic (Python).

Written for these tests after the reference servers' tools (names, descriptions and schema shapes),
as their ``tools/list`` answers look on the wire.
"""

from __future__ import annotations

from typing import Any

import mcp_types

_ZOD = {"additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}


def tools(*wire: dict[str, Any]) -> list[mcp_types.Tool]:
    return [mcp_types.Tool.model_validate(tool) for tool in wire]


# mcp-server-time (Python, low-level server: hand-written schemas).
TIME = tools(
    {
        "name": "get_current_time",
        "description": "Get current time in a specific timezones",
        "inputSchema": {
            "type": "object",
            "properties": {
                "timezone": {
                    "type": "string",
                    "description": "IANA timezone name (e.g., 'America/New_York', 'Europe/London'). "
                    "Use 'UTC' as local timezone if no timezone provided by the user.",
                }
            },
            "required": ["timezone"],
        },
        "outputSchema": {
            "type": "object",
            "title": "TimeResult",
            "properties": {
                "timezone": {"type": "string", "title": "Timezone"},
                "datetime": {"type": "string", "title": "Datetime"},
                "day_of_week": {"type": "string", "title": "Day Of Week"},
                "is_dst": {"type": "boolean", "title": "Is Dst"},
            },
            "required": ["timezone", "datetime", "day_of_week", "is_dst"],
        },
    },
    {
        "name": "convert_time",
        "description": "Convert time between timezones",
        "inputSchema": {
            "type": "object",
            "properties": {
                "source_timezone": {
                    "type": "string",
                    "description": "Source IANA timezone name (e.g., 'America/New_York', 'Europe/London'). "
                    "Use 'UTC' as local timezone if no source timezone provided by the user.",
                },
                "time": {"type": "string", "description": "Time to convert in 24-hour format (HH:MM)"},
                "target_timezone": {
                    "type": "string",
                    "description": "Target IANA timezone name (e.g., 'Asia/Tokyo', 'America/San_Francisco'). "
                    "Use 'UTC' as local timezone if no target timezone provided by the user.",
                },
            },
            "required": ["source_timezone", "time", "target_timezone"],
        },
    },
)

# @modelcontextprotocol/server-everything (TypeScript, zod-to-json-schema).
EVERYTHING = tools(
    {
        "name": "echo",
        "description": "Echoes back the input",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string", "description": "Message to echo"}},
            "required": ["message"],
            **_ZOD,
        },
    },
    {
        "name": "add",
        "description": "Adds two numbers",
        "inputSchema": {
            "type": "object",
            "properties": {
                "a": {"type": "number", "description": "First number"},
                "b": {"type": "number", "description": "Second number"},
            },
            "required": ["a", "b"],
            **_ZOD,
        },
    },
    {
        "name": "longRunningOperation",
        "description": "Demonstrates a long running operation with progress updates",
        "inputSchema": {
            "type": "object",
            "properties": {
                "duration": {"type": "number", "default": 10, "description": "Duration of the operation in seconds"},
                "steps": {"type": "number", "default": 5, "description": "Number of steps in the operation"},
            },
            **_ZOD,
        },
    },
    {
        "name": "getTinyImage",
        "description": "Returns the MCP_TINY_IMAGE",
        "inputSchema": {"type": "object", "properties": {}, **_ZOD},
    },
    {
        "name": "annotatedMessage",
        "description": "Demonstrates how annotations can be used to provide metadata about content",
        "inputSchema": {
            "type": "object",
            "properties": {
                "messageType": {
                    "type": "string",
                    "enum": ["error", "success", "debug"],
                    "description": "Type of message to demonstrate different annotation patterns",
                },
                "includeImage": {
                    "type": "boolean",
                    "default": False,
                    "description": "Whether to include an example image",
                },
            },
            "required": ["messageType"],
            **_ZOD,
        },
    },
    {
        "name": "getStructuredContent",
        "description": "Returns structured content along with an output schema for client data validation",
        "inputSchema": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "enum": ["New York", "Chicago", "Los Angeles"],
                    "description": "Choose city",
                }
            },
            "required": ["location"],
            **_ZOD,
        },
        "outputSchema": {
            "type": "object",
            "properties": {
                "temperature": {"type": "number", "description": "Temperature in celsius"},
                "conditions": {"type": "string", "description": "Weather conditions description"},
                "humidity": {"type": "number", "description": "Humidity percentage"},
            },
            "required": ["temperature", "conditions", "humidity"],
            **_ZOD,
        },
    },
)

# @modelcontextprotocol/server-memory (TypeScript, hand-written schemas).
_ENTITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "The name of the entity"},
        "entityType": {"type": "string", "description": "The type of the entity"},
        "observations": {
            "type": "array",
            "items": {"type": "string"},
            "description": "An array of observation contents associated with the entity",
        },
    },
    "required": ["name", "entityType", "observations"],
}
MEMORY = tools(
    {
        "name": "create_entities",
        "description": "Create multiple new entities in the knowledge graph",
        "inputSchema": {
            "type": "object",
            "properties": {"entities": {"type": "array", "items": _ENTITY}},
            "required": ["entities"],
        },
    },
    {
        "name": "add_observations",
        "description": "Add new observations to existing entities in the knowledge graph",
        "inputSchema": {
            "type": "object",
            "properties": {
                "observations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "entityName": {
                                "type": "string",
                                "description": "The name of the entity to add the observations to",
                            },
                            "contents": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "An array of observation contents to add",
                            },
                        },
                        "required": ["entityName", "contents"],
                    },
                }
            },
            "required": ["observations"],
        },
    },
    {
        "name": "delete_entities",
        "description": "Delete multiple entities and their associated relations from the knowledge graph",
        "inputSchema": {
            "type": "object",
            "properties": {
                "entityNames": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "An array of entity names to delete",
                }
            },
            "required": ["entityNames"],
        },
    },
    {
        "name": "read_graph",
        "description": "Read the entire knowledge graph",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "search_nodes",
        "description": "Search for nodes in the knowledge graph based on a query",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "The search query to match against entity names, types, and observation content",
                }
            },
            "required": ["query"],
        },
    },
    {
        "name": "open_nodes",
        "description": "Open specific nodes in the knowledge graph by their names",
        "inputSchema": {
            "type": "object",
            "properties": {
                "names": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "An array of entity names to retrieve",
                }
            },
            "required": ["names"],
        },
    },
)

# @modelcontextprotocol/server-filesystem (TypeScript, zod-to-json-schema).
FILESYSTEM = tools(
    {
        "name": "read_file",
        "description": "Read the complete contents of a file as text. DEPRECATED: Use read_text_file instead.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "tail": {"type": "number", "description": "If provided, returns only the last N lines of the file"},
                "head": {"type": "number", "description": "If provided, returns only the first N lines of the file"},
            },
            "required": ["path"],
            **_ZOD,
        },
    },
    {
        "name": "read_text_file",
        "description": "Read the complete contents of a file from the file system as text. Handles various text "
        "encodings and provides detailed error messages if the file cannot be read. Use the 'head' parameter to "
        "read only the first N lines of a file, or the 'tail' parameter to read only the last N lines of a file. "
        "Only works within allowed directories.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "tail": {"type": "number", "description": "If provided, returns only the last N lines of the file"},
                "head": {"type": "number", "description": "If provided, returns only the first N lines of the file"},
            },
            "required": ["path"],
            **_ZOD,
        },
    },
    {
        "name": "read_multiple_files",
        "description": "Read the contents of multiple files simultaneously. This is more efficient than reading "
        "files one by one when you need to analyze or compare multiple files. Only works within allowed "
        "directories.",
        "inputSchema": {
            "type": "object",
            "properties": {"paths": {"type": "array", "items": {"type": "string"}}},
            "required": ["paths"],
            **_ZOD,
        },
    },
    {
        "name": "write_file",
        "description": "Create a new file or completely overwrite an existing file with new content. Use with "
        "caution as it will overwrite existing files without warning. Only works within allowed directories.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            **_ZOD,
        },
    },
    {
        "name": "edit_file",
        "description": "Make line-based edits to a text file. Each edit replaces exact line sequences with new "
        "content. Returns a git-style diff showing the changes made. Only works within allowed directories.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "edits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "oldText": {"type": "string", "description": "Text to search for - must match exactly"},
                            "newText": {"type": "string", "description": "Text to replace with"},
                        },
                        "required": ["oldText", "newText"],
                        "additionalProperties": False,
                    },
                },
                "dryRun": {"type": "boolean", "default": False, "description": "Preview changes using git-style diff"},
            },
            "required": ["path", "edits"],
            **_ZOD,
        },
    },
    {
        "name": "list_directory",
        "description": "Get a detailed listing of all files and directories in a specified path. Results clearly "
        "distinguish between files and directories with [FILE] and [DIR] prefixes.",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            **_ZOD,
        },
    },
    {
        "name": "search_files",
        "description": "Recursively search for files and directories matching a pattern. Searches through all "
        "subdirectories from the starting path.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "pattern": {"type": "string"},
                "excludePatterns": {"type": "array", "items": {"type": "string"}, "default": []},
            },
            "required": ["path", "pattern"],
            **_ZOD,
        },
    },
)

# mcp-server-git (Python, pydantic models' JSON schemas).
_REPO = {"repo_path": {"title": "Repo Path", "type": "string"}}
GIT = tools(
    {
        "name": "git_status",
        "description": "Shows the working tree status",
        "inputSchema": {"type": "object", "title": "GitStatus", "properties": _REPO, "required": ["repo_path"]},
    },
    {
        "name": "git_log",
        "description": "Shows the commit logs",
        "inputSchema": {
            "type": "object",
            "title": "GitLog",
            "properties": {**_REPO, "max_count": {"default": 10, "title": "Max Count", "type": "integer"}},
            "required": ["repo_path"],
        },
    },
    {
        "name": "git_diff_unstaged",
        "description": "Shows changes in the working directory that are not yet staged",
        "inputSchema": {"type": "object", "title": "GitDiffUnstaged", "properties": _REPO, "required": ["repo_path"]},
    },
    {
        "name": "git_commit",
        "description": "Records changes to the repository",
        "inputSchema": {
            "type": "object",
            "title": "GitCommit",
            "properties": {**_REPO, "message": {"title": "Message", "type": "string"}},
            "required": ["repo_path", "message"],
        },
    },
    {
        "name": "git_add",
        "description": "Adds file contents to the staging area",
        "inputSchema": {
            "type": "object",
            "title": "GitAdd",
            "properties": {**_REPO, "files": {"items": {"type": "string"}, "title": "Files", "type": "array"}},
            "required": ["repo_path", "files"],
        },
    },
    {
        "name": "git_show",
        "description": "Shows the contents of a commit",
        "inputSchema": {
            "type": "object",
            "title": "GitShow",
            "properties": {**_REPO, "revision": {"title": "Revision", "type": "string"}},
            "required": ["repo_path", "revision"],
        },
    },
)

# A FastMCP (pydantic) server: $defs/$ref, anyOf with null, titles, an output schema with $defs.
ISSUES = tools(
    {
        "name": "search_issues",
        "description": "Search the issue tracker.\n\nReturns the matching issues, newest first.",
        "inputSchema": {
            "type": "object",
            "title": "search_issuesArguments",
            "properties": {
                "query": {"title": "Query", "type": "string", "description": "Words to look for"},
                "filter": {"anyOf": [{"$ref": "#/$defs/IssueFilter"}, {"type": "null"}], "default": None},
                "max-results": {"default": 20, "title": "Max-Results", "type": "integer"},
                "from": {
                    "anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}],
                    "default": None,
                    "title": "From",
                    "description": "Only issues updated since then",
                },
                "sort": {"default": "updated", "enum": ["updated", "created"], "title": "Sort", "type": "string"},
            },
            "required": ["query"],
            "$defs": {
                "IssueFilter": {
                    "type": "object",
                    "title": "IssueFilter",
                    "description": "Which issues to include.",
                    "properties": {
                        "state": {"default": "open", "enum": ["open", "closed"], "title": "State", "type": "string"},
                        "labels": {"items": {"type": "string"}, "title": "Labels", "type": "array"},
                        "assignee": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                    },
                    "required": ["labels"],
                }
            },
        },
        "outputSchema": {
            "type": "object",
            "title": "SearchResult",
            "properties": {
                "issues": {"items": {"$ref": "#/$defs/Issue"}, "title": "Issues", "type": "array"},
                "total": {"title": "Total", "type": "integer"},
            },
            "required": ["issues", "total"],
            "$defs": {
                "Issue": {
                    "type": "object",
                    "title": "Issue",
                    "properties": {
                        "number": {"title": "Number", "type": "integer"},
                        "title": {"title": "Title", "type": "string"},
                        "labels": {"items": {"type": "string"}, "type": "array"},
                        "parent": {"anyOf": [{"$ref": "#/$defs/Issue"}, {"type": "null"}], "default": None},
                    },
                    "required": ["number", "title"],
                }
            },
        },
    },
)

SERVERS: dict[str, list[mcp_types.Tool]] = {
    "time": TIME,
    "everything": EVERYTHING,
    "memory": MEMORY,
    "filesystem": FILESYSTEM,
    "git": GIT,
    "issues": ISSUES,
}
