"""Test rank: ``record_fail.py FAILRANK``. The entry point is decorated with torch's ``@record``;
FAILRANK raises inside it, and the script then turns the exception into ``sys.exit(1)``, as
scripts that log and exit do. Only ``@record``'s TORCHELASTIC_ERROR_FILE then holds the error."""
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(fail_rank: int) -> None:
    import os

    if int(os.environ["RANK"]) == fail_rank:
        raise RuntimeError(f"recorded failure in rank {os.environ['RANK']}")


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]))
    except RuntimeError:
        sys.exit(1)
