"""The text between the model and the game: parsing of its replies."""

from mage.protocol.parsing import ParsedAction, ParsedRemark, extract_tag, parse_action, parse_remark

__all__ = ["ParsedAction", "ParsedRemark", "extract_tag", "parse_action", "parse_remark"]
