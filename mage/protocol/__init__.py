"""The text between the model and the game: parsing of its replies, and the tags that end them."""

from mage.protocol.parsing import (
    PHASE_STOP_STRINGS,
    STOP_STRINGS,
    THINK_CLOSE,
    THINK_OPEN,
    ParsedAction,
    ParsedRemark,
    extract_tag,
    parse_action,
    parse_remark,
)

__all__ = ["PHASE_STOP_STRINGS", "STOP_STRINGS", "THINK_CLOSE", "THINK_OPEN", "ParsedAction", "ParsedRemark",
           "extract_tag", "parse_action", "parse_remark"]
