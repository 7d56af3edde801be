#!/usr/bin/env python3
"""Writes the translate target's seeds for the cogency and agent_sdk dialects (fuzz/README.md).

Each seed is a header (fuzz/check.rs: flags, budget, limits, split count) and two split offsets, then one
fixture of tests/fixtures/dialects/ byte for byte. Every cogency and agent_sdk fixture is seeded under its own
dialect; a few again under auto, with the smallest budget, or with `require_done`; the `other_` inputs under the
dialect they are not. Run from the repository root after the fixtures change; a rerun writes the same files.
"""

from pathlib import Path

FIXTURES = Path("tests/fixtures/dialects")
CORPUS = Path("fuzz/corpus/translate")

AUTO, COGENCY, AGENT_SDK = "auto", "cogency", "agent_sdk"
DEFAULT_BUDGET, MIN_BUDGET = 112, 0  # byte 1: budget 256 + 16 * b (112: 2048, the default; 0: 256)
REQUIRE_DONE = 128  # byte 2, bit 7
SPLITS = 2


def header(dialect: str, budget: int, limits: int) -> bytes:
    # Byte 0 bits 0-1: 0 auto, 3 a JSON dialect; byte 3: the split count mod 17, its top bit set for agent_sdk
    # (2 + 17 * 8 = 138 is 2 mod 17).
    flags = 0 if dialect == AUTO else 3
    splits = SPLITS + 17 * 8 if dialect == AGENT_SDK else SPLITS
    return bytes([flags, budget, limits, splits])


def seed(name: str, fixture: str, dialect: str, budget: int = DEFAULT_BUDGET, limits: int = 0) -> None:
    stream = (FIXTURES / f"{fixture}.sse").read_bytes()
    # Cuts a third and two thirds in (taken mod len + 1 by the target): mid-event in every fixture.
    cuts = b"".join((len(stream) * i // 3).to_bytes(2, "little") for i in (1, 2))
    (CORPUS / name).write_bytes(header(dialect, budget, limits) + cuts + stream)


def main() -> None:
    for path in sorted(FIXTURES.glob("*.sse")):
        name = path.stem
        if name.startswith("cogency"):
            seed(name, name, COGENCY)
        elif name.startswith("agent_sdk_"):
            seed(name, name, AGENT_SDK)
    # Told from the first event.
    for name in ("cogency_call_result", "cogency30_long_respond", "agent_sdk_partial_on", "agent_sdk_seed004"):
        seed(f"auto_{name}", name, AUTO)
    seed("auto_other_legacy_xml", "other_legacy_xml", AUTO)
    # Long blocks chunked within the smallest budget.
    seed("budget256_agent_sdk_partial_on", "agent_sdk_partial_on", AGENT_SDK, budget=MIN_BUDGET)
    seed("budget256_cogency_utf8_escapes", "cogency_utf8_escapes", COGENCY, budget=MIN_BUDGET)
    # `require_done` against the dialects' own clean ends.
    seed("require_done_cogency_respond", "cogency_respond", COGENCY, limits=REQUIRE_DONE)
    seed("require_done_agent_sdk_error_result", "agent_sdk_error_result", AGENT_SDK, limits=REQUIRE_DONE)
    # Not the dialect named, or not whole.
    seed("cogency_other_json_shape", "other_json_shape", COGENCY)
    seed("cogency_other_legacy_xml", "other_legacy_xml", COGENCY)
    seed("cogency_other_truncated", "other_truncated_cogency", COGENCY)
    seed("agent_sdk_other_json_shape", "other_json_shape", AGENT_SDK)
    seed("agent_sdk_other_cogency", "cogency_respond", AGENT_SDK)
    seed("agent_sdk_other_truncated", "other_truncated_agent_sdk", AGENT_SDK)


if __name__ == "__main__":
    main()
