"""Reads a translated stream from sse-gateway with httpx-sse and prints each event's data, one per line.

Usage: python3 client.py URL
"""
import sys

import httpx
from httpx_sse import connect_sse


def main() -> None:
    url = sys.argv[1]
    with httpx.Client(timeout=30.0) as client:
        with connect_sse(client, "POST", url, json={}) as source:
            source.response.raise_for_status()
            for event in source.iter_sse():
                sys.stdout.write(event.data + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
