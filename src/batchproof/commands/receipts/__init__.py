"""Re-executing receipts for `batchproof verify-receipt` (docs/receipts.md): on an engine in this
process or on a server over HTTP (each a Host with the same three methods), by scoring the known
tokens in one prefill where that decides every bit, else by generating again with the same seed."""
