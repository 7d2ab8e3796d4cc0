"""memrl's worlds in other trainers' environment interfaces: an OpenEnv server (`openenv`) and a verifiers
environment (`verifiers`), both over the worlds' own episodes (`worlds`). Optional extras: `.[openenv]`,
`.[verifiers]`; nothing else in memrl imports them."""
