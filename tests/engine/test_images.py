"""Images from matplotlib: ``plt.show()`` and ``savefig`` to an image file come back with the result."""

from __future__ import annotations

import struct
import zlib

import pytest

from mcp_sandbox.engine import Image
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import PROTOCOL_VERSION

from .conftest import RunningEngine
from .helpers import execute

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of an 8-bit PNG, after checking that its pixel data decodes to exactly that."""
    assert data.startswith(PNG_SIGNATURE)
    offset, header, pixels = len(PNG_SIGNATURE), b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            pixels += body
        offset += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8
    # Each row: a filter byte, then the samples of every pixel.
    assert len(zlib.decompress(pixels)) == height * (1 + width * _CHANNELS[colour])
    return width, height


FIGURE = "import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=50)\nplt.plot([1, 3, 2])\n"


async def test_plt_show_returns_each_open_figure_as_a_png(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        result = await execute(
            engine, FIGURE + "plt.show()\nprint(plt.get_fignums())\nimport matplotlib\nprint(matplotlib.get_backend())"
        )

    assert result.status == "success", result.stderr
    ((image),) = result.images
    assert image.mime == "image/png"
    assert png_size(image.data) == (150, 100)
    assert result.stdout.splitlines()[0] == "[]"  # shown figures are closed, as in a notebook
    assert "mcp_sandbox_runtime" in result.stdout.splitlines()[1]


async def test_savefig_to_an_image_file_returns_it_and_writes_the_file(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        result = await execute(
            engine,
            FIGURE
            + "plt.savefig('/workspace/a.png')\nplt.savefig('/workspace/b.jpg')\nplt.savefig('/workspace/c')\n"
            + "import io\nplt.savefig(io.BytesIO(), format='png')\nplt.savefig('/workspace/d.svg')\n"
            + "print(open('/workspace/a.png', 'rb').read()[:4])",
        )

    assert result.status == "success", result.stderr
    assert [image.mime for image in result.images] == ["image/png", "image/jpeg", "image/png"]
    assert png_size(result.images[0].data) == (150, 100)
    assert result.images[1].data.startswith(b"\xff\xd8")  # JPEG start of image
    assert png_size(result.images[2].data) == (150, 100)  # matplotlib appended .png to the bare name
    assert result.stdout == "b'\\x89PNG'\n"


async def test_at_most_max_images_come_back_and_the_rest_is_said_on_stderr(running_engine: RunningEngine) -> None:
    async with running_engine(max_images=2) as engine:
        result = await execute(engine, FIGURE + "for _ in range(3):\n    plt.figure()\n    plt.plot([1])\nplt.show()")

    assert len(result.images) == 2
    assert "image not returned" in result.stderr


async def test_an_image_over_max_image_bytes_does_not_come_back(running_engine: RunningEngine) -> None:
    async with running_engine(max_image_bytes=200) as engine:
        result = await execute(engine, FIGURE + "plt.show()")

    assert (result.status, result.images) == ("success", ())
    assert "image not returned" in result.stderr


async def test_no_images_are_allowed_when_max_images_is_zero(running_engine: RunningEngine) -> None:
    async with running_engine(max_images=0) as engine:
        result = await execute(engine, FIGURE + "plt.show()")

    assert (result.status, result.images) == ("success", ())


async def test_a_subprocess_of_the_code_uses_plain_agg(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        result = await execute(
            engine,
            "import subprocess, sys\n"
            "code = 'import matplotlib.pyplot as plt; plt.plot([1]); plt.show(); print(plt.get_backend())'\n"
            "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout)",
        )

    assert (result.stdout.strip().lower(), result.images) == ("agg", ())


async def test_images_belong_to_the_run_of_a_session_that_made_them(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        first = await execute(engine, FIGURE + "plt.show()", session="s")
        second = await execute(engine, "plt.show()\nfig = plt.figure()\nprint(len(plt.get_fignums()))", session="s")
        third = await execute(engine, "plt.show()", session="s")

    assert (len(first.images), second.images, second.stdout) == (1, (), "1\n")
    assert len(third.images) == 1  # the figure left open in the second run, shown in the third


FORGE = """
import base64, json, os, stat, struct
def frame(kind, body):
    data = json.dumps(body).encode()
    return struct.pack(">4sBBI", b"MSBX", VERSION, kind, len(data)) + data
def is_socket(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:  # the directory listing's own fd
        return False
fds = [int(fd) for fd in os.listdir("/proc/self/fd") if is_socket(int(fd))]
png = base64.b64encode(b"\\x89PNG fake").decode()
for body in [
    {"run": 1, "mime": "image/png", "data": "%%% not base64"},
    {"run": 1, "mime": "text/html", "data": png},
    {"run": 1, "mime": "image/png", "data": base64.b64encode(b"x" * 1001).decode()},
    {"run": 7, "mime": "image/png", "data": png},
    {"run": 1, "mime": "image/png", "data": png},
]:
    os.write(fds[0], frame(7, body))
""".replace("VERSION", str(PROTOCOL_VERSION))


async def test_the_host_keeps_only_well_formed_images_of_the_run_within_the_caps(running_engine: RunningEngine) -> None:
    # A fresh sandbox of its own (no warm pool), so that the run is the sandbox's first: run 1.
    async with running_engine(max_image_bytes=1000, pool_size=0, pool_min=0) as engine:
        result = await execute(engine, FORGE)

    assert result.status == "success", result.stderr
    assert result.images == (Image("image/png", b"\x89PNG fake"),)


async def test_a_display_frame_larger_than_the_image_cap_ends_the_run(running_engine: RunningEngine) -> None:
    # Issue 21, finding 1: a DISPLAY frame may be as large as an image at the cap, in base64, and
    # no larger; the host refuses a larger one on its header and the run ends with the reason.
    oversized = FORGE.split("for body in")[0] + (
        "os.write(fds[0], frame(7, {'run': 1, 'mime': 'image/png', 'data': 'A' * 200_000}))\n"
        "import time\ntime.sleep(20)\n"
    )
    async with running_engine(max_image_bytes=1000, pool_size=0, pool_min=0) as engine:
        result = await execute(engine, oversized, time_limit=30)

    assert result.status == "error"
    assert result.error is not None and "DISPLAY frame" in result.error
    assert result.images == ()
