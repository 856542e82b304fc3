import sys

from rag_stream.cli import main

if __name__ == "__main__":
    sys.exit(main())
