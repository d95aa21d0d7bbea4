"""The scope of the by-hand mutation run (docs/testing.md): in a cosmic-ray session, every mutant outside the
verdict code is marked skipped, and of the operators only those that change what a verdict decides (a comparison,
a boolean, a constant, a loop, an exception, + and -), not the ten ways of replacing each arithmetic operator.

    python benchmarks/mutation_scope.py SESSION.sqlite FUNCTION[,FUNCTION...]
"""

import re
import sqlite3
import sys

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

KEEP = re.compile(
    r"core/(NumberReplacer|AddNot|ReplaceUnaryOperator_Delete_Not|ReplaceTrueWithFalse|ReplaceFalseWithTrue"
    r"|ReplaceAndWithOr|ReplaceOrWithAnd|ZeroIterationForLoop|ExceptionReplacer|RemoveDecorator"
    r"|ReplaceBinaryOperator_(Add_Sub|Sub_Add)"
    r"|ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Lt_Gt|Gt_Lt|LtE_GtE|GtE_LtE"
    r"|In_NotIn|NotIn_In|Is_IsNot|IsNot_Is))$"
)


def main(session: str, functions: str) -> None:
    wanted = set(functions.split(","))
    with sqlite3.connect(session) as c:
        where = dict(c.execute("select job_id, definition_name from mutation_specs"))
    kept = skipped = 0
    with use_db(session, WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            (m,) = item.mutations
            if KEEP.match(m.operator_name) and where.get(item.job_id) in wanted:
                kept += 1
            else:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
                skipped += 1
    print(f"{kept} mutants to run, {skipped} skipped")


if __name__ == "__main__":
    main(*sys.argv[1:])
