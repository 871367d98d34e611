"""Arrow helpers every layer shares: IPC streams as quorumstore carries them (`ipc`),
numpy views of binary arrays' buffers (`binary`), and protobuf fields encoded a whole
column at a time (`protobuf_columns`)."""
