"""Multi-session task-oriented dialogue (MS-TOD): data, memory banks, the memory pipeline and its simulator."""
