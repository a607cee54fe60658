"""The real ComfyUI HTTP server (main.py) on a free loopback port, with this pack loaded."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from .host import comfyui_dir, make_base_directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ComfyServer:
    """Start with ``with ComfyServer() as server:``; the process group is gone after the block."""

    def __init__(self, startup_timeout: float = 120.0, test_nodes: bool = True, threads: int | None = 1,
                 base_directory: pathlib.Path | None = None) -> None:
        # An existing base directory is reused as is (e.g. a second server finding the first one's files).
        self.base_directory = base_directory or make_base_directory("stepcache-server-", test_nodes)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base_directory / "server.log"
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.client_id = uuid.uuid4().hex
        # Tiny CPU models run fastest on one thread and then do not fight other processes for cores.
        self.threads = threads

    def __enter__(self) -> ComfyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        root = comfyui_dir()
        command = [
            sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
            "--disable-auto-launch", "--base-directory", str(self.base_directory),
            "--database-url", "sqlite:///:memory:",
        ]
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            command, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 **({"OMP_NUM_THREADS": str(self.threads)} if self.threads else {})},
        )
        # Up once it answers: ComfyUI opens its port only after loading every node pack.
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI exited at start-up:\n{self.log()}")
            try:
                self.get("/system_stats", timeout=max(1.0, min(30.0, deadline - time.monotonic())))
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.25)  # the polling interval, not a wait for anything
        self.stop()
        raise TimeoutError(f"ComfyUI did not answer within {self.startup_timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # HTTP --------------------------------------------------------------------------------

    def get(self, path: str, timeout: float = 30.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def queue(self, graph: dict) -> str:
        """POST an API-format graph; returns the prompt id (raises with node_errors on rejection)."""
        status, body = self.post("/prompt", {"prompt": graph, "client_id": self.client_id})
        if status != 200:
            raise PromptRejected(body)
        return body["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 120.0) -> dict:
        """The /history entry of a finished prompt, polled until it is there or `timeout` seconds
        have passed. A poll the busy server does not answer in time is a poll that saw nothing yet:
        only the deadline (or the server's death) ends the wait."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            try:
                history = self.get(f"/history/{prompt_id}", timeout=max(1.0, min(30.0, deadline - time.monotonic())))
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                history, last_error = {}, error
            if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
                entry = history[prompt_id]
                if entry["status"]["status_str"] in ("success", "error"):
                    return entry
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"ComfyUI died while running {prompt_id}:\n{self.log()}")
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)  # the polling interval, not a wait for anything
        raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout}s"
                           + (f" (last poll failed: {last_error!r})" if last_error else ""))

    def run(self, graph: dict, timeout: float = 120.0) -> dict:
        return self.wait(self.queue(graph), timeout)

    def execution_seconds(self, entry: dict) -> float:
        """Wall time of a finished prompt, from the server's own start/success timestamps."""
        stamps = {name: data.get("timestamp") for name, data in entry["status"]["messages"]}
        return (stamps["execution_success"] - stamps["execution_start"]) / 1000.0

    def output_files(self) -> list[pathlib.Path]:
        return sorted(p for p in (self.base_directory / "output").rglob("*") if p.is_file())


class PromptRejected(Exception):
    def __init__(self, body: Any) -> None:
        super().__init__(json.dumps(body, indent=1)[:4000])
        self.body = body
