"""dctdata.preprocess: offline side. Dataset sources (npy/npz, HDF5, image folders, torch datasets,
synthetic SciML stand-ins) and the writers that pack them. Imports only from dctdata core."""
