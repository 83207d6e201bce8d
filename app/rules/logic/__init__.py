"""One module per rule kind; each class follows the contract in :mod:`app.rules.logic.base`."""
