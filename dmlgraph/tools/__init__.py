"""The faces: the command line, folder batches, text reports, inspection views and the DxDispatch export."""
