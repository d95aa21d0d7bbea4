"""One module per command group. `Command` is the class every command is built with."""

from __future__ import annotations

from typer.core import TyperCommand


class Command(TyperCommand):
    """Help that reads like the command's own usage: an option that takes a value shows a name for it (TP,
    FILE), never Python's type; a flag shows nothing; an argument shows its name, [in brackets] if optional."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if p.param_type_name == "option" and not p.is_flag and p.metavar is None:
                p.metavar = _value_name(p)
            elif p.param_type_name == "argument":
                p.display_type_rich = lambda ctx=None: None  # its name says what it is: no "<path>" beside it

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = (p.metavar or p.name.upper()) + ("..." if p.nargs != 1 else "")
                pieces.append(name if p.required else f"[{name}]")
        return pieces


def _value_name(option) -> str:
    """What an option's value is called in help: its choices, FILE for a path, else its flag's name."""
    desc = getattr(option, "type_descriptor", None)  # Typer 0.2x; before, Click's own type
    choices = (desc.choices if desc.is_choice else None) if desc else getattr(option.type, "choices", None)
    if choices:
        return "|".join(str(getattr(c, "value", c)) for c in choices)
    if desc.is_path if desc else any(c.__name__ == "Path" for c in type(option.type).__mro__):
        return "FILE"
    return max(option.opts, key=len).lstrip("-").replace("-", "_").upper()
