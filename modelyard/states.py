"""The one state-machine helper behind every stateful row: deployment targets, rollouts and uploads.

Each machine is a table of allowed moves (``StateMachine.moves``); every change of state goes
through ``StateMachine.move``, a compare-and-set ``UPDATE ... WHERE state = <the state read>`` so two
writers racing for one row cannot both win, and a refused move raises the one exception type,
``IllegalTransition`` (a ``Conflict``: HTTP 409 where it reaches the API).
"""

from collections.abc import Mapping
from dataclasses import dataclass

from modelyard.errors import Conflict


class IllegalTransition(Conflict):
    """A change of state the machine does not allow from the state the row has; the message says
    which row, which state and what was asked for."""


@dataclass(frozen=True)
class StateMachine:
    """The allowed moves of one kind of row.

    Attributes:
        name: what the rows are, for messages ("target", "upload", …).
        field: the model field holding the state.
        moves: ``{state: states it may move to}``; a state missing from the table allows no move.
    """

    name: str
    field: str
    moves: Mapping[str, frozenset[str]]

    def allows(self, current: str, wanted: str) -> bool:
        """True when ``wanted`` may follow ``current``."""
        return wanted in self.moves.get(current, frozenset())

    def move(self, row, wanted: str, *, refusal: str = "", **fields) -> bool:
        """Move ``row`` (a model instance, its state as last read) to ``wanted``, setting ``fields`` too.

        A compare-and-set on the state read: when another writer changed the row meanwhile, nothing
        is written. The instance is updated on success.

        Args:
            row: the instance; its ``field`` holds the state it was read with.
            wanted: the new state.
            refusal: the message of the ``IllegalTransition`` raised for a move not allowed (default:
                "<name> <pk> is <state>; it cannot become <wanted>").
            fields: other columns to set in the same UPDATE.

        Returns:
            True when this call made the change; False when the row already was in ``wanted`` (a
            repeat is a no-op) or another writer changed it first.

        Raises:
            IllegalTransition: ``wanted`` may not follow the state read.
        """
        current = getattr(row, self.field)
        if current == wanted:
            return False
        if not self.allows(current, wanted):
            raise IllegalTransition(refusal or f"{self.name} {row.pk} is {current}; it cannot become {wanted}")
        changed = type(row).objects.filter(pk=row.pk, **{self.field: current}).update(**{self.field: wanted}, **fields)
        if changed:
            setattr(row, self.field, wanted)
            for name, value in fields.items():
                setattr(row, name, value)
        return bool(changed)
